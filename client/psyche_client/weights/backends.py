"""Which training backend a client builds, from a small registry: `dummy` (no model, no
torch), `distro` (one device) and `parallel` (several local ranks).

`BackendOptions.kind` names the entry the options select; `BACKENDS` maps each name to a
loader. A loader runs in a worker thread (importing torch and transformers takes seconds, tens
on a loaded machine, and the event loop must keep reading the server's states) and is given
the coordinator state, the options, and the model config a majority of peers shares (None
when the model comes from its checkpoint's repository).

`with_distro_backend` gives a registry whose distro entry loads a `DistroBackend` subclass
the same way, for a test or attack client that trains differently
(`Parts(backends=with_distro_backend(MyBackend))`, tests/e2e/signflip_client.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Literal

from psyche_common.coordinator import Coordinator

from psyche_client.training.backend import DummyBackend, TrainingBackend
from psyche_client.training.model.precision import AttnImplementation, DtypeName, Precision
from psyche_client.training.parallel.plan import ParallelSpec

if TYPE_CHECKING:
    from psyche_client.training.distro_backend import DistroBackend

log = logging.getLogger("psyche.client")

BackendKind = Literal["dummy", "distro", "parallel"]
PeerConfig = dict[str, object]
"""A model config (the `config.json` of a Hugging Face model) shared by peers."""


@dataclass(frozen=True)
class BackendOptions:
    """How this client trains: device, micro-batch size, numerics (`precision`), local ranks,
    or the dummy backend."""

    device: str = "auto"
    micro_batch_size: int = 1
    dtype: DtypeName = "auto"
    """Parameter dtype: bf16, fp32 or auto (bf16 on CUDA, fp32 elsewhere)."""
    grad_accum_in_fp32: bool = False
    activation_checkpointing: bool = False
    attn_implementation: AttnImplementation = "sdpa"
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    parallel_timeout: float = 300.0
    """Seconds a rank may keep the others waiting before the client gives up on it."""
    optim_stats_steps: int = 0
    """N > 0: measure the DisTrO optimizer every N steps (`training.optim_stats`)."""
    dummy_delay_secs: float | None = None
    """Not None: the dummy backend (no model), every batch sleeping this long."""
    dummy_seconds_per_sample: float = 0.0
    """Seconds each sample adds to a dummy batch's sleep (`--dummy-seconds-per-sample`)."""
    dummy_result_size: int = DummyBackend.PAYLOAD_SIZE
    dummy_model_size: int = 0
    hub_max_concurrent_downloads: int = 3
    """Files of a Hub model fetched at once (`--hub-max-concurrent-downloads`)."""

    @property
    def precision(self) -> Precision:
        """The numeric settings the trainer and the model loader take."""
        return Precision(
            self.dtype,
            self.grad_accum_in_fp32,
            self.activation_checkpointing,
            self.attn_implementation,
        )

    @property
    def kind(self) -> BackendKind:
        if self.dummy_delay_secs is not None:
            return "dummy"
        if self.parallel.data_parallelism > 1:
            return "parallel"
        return "distro"


BackendLoader = Callable[[Coordinator, BackendOptions, PeerConfig | None, bool], TrainingBackend]
"""(coordinator, options, peer config, from peers) → a loaded backend (blocking)."""


def load_dummy(
    _coordinator: Coordinator, options: BackendOptions, _peer: PeerConfig | None, _: bool
) -> TrainingBackend:
    assert options.dummy_delay_secs is not None
    return DummyBackend(
        options.dummy_delay_secs,
        seconds_per_sample=options.dummy_seconds_per_sample,
        result_size=options.dummy_result_size,
        model_size=options.dummy_model_size,
    )


def load_distro(
    coordinator: Coordinator,
    options: BackendOptions,
    peer_config: PeerConfig | None,
    from_peers: bool,
) -> TrainingBackend:
    from psyche_client.training.distro_backend import DistroBackend

    return load_distro_as(DistroBackend, coordinator, options, peer_config, from_peers)


def load_distro_as(
    backend: type[DistroBackend],
    coordinator: Coordinator,
    options: BackendOptions,
    peer_config: PeerConfig | None,
    from_peers: bool,
) -> DistroBackend:
    """`backend` (the `DistroBackend` or a subclass) loaded for the run with `options`."""
    return backend.load(
        coordinator,
        device=options.device,
        micro_batch_size=options.micro_batch_size,
        from_peers=from_peers,
        peer_config=peer_config,
        precision=options.precision,
        optim_stats_steps=options.optim_stats_steps,
    )


def load_parallel(
    coordinator: Coordinator,
    options: BackendOptions,
    peer_config: PeerConfig | None,
    from_peers: bool,
) -> TrainingBackend:
    """Like `load_distro`, over several local ranks (torch imported here too)."""
    from psyche_client.training.parallel.backend import ParallelBackend

    if options.optim_stats_steps:
        log.warning(
            "--optim-stats-steps: a client training on several ranks measures no optimizer "
            "statistics"
        )

    return ParallelBackend.load(
        coordinator,
        spec=options.parallel,
        device=options.device,
        micro_batch_size=options.micro_batch_size,
        timeout=options.parallel_timeout,
        from_peers=from_peers,
        peer_config=peer_config,
        precision=options.precision,
    )


@dataclass(frozen=True)
class BackendEntry:
    load: BackendLoader
    builds_model: bool = True
    """False: no model to build (no peer config to ask for, nothing to load in a thread)."""


BACKENDS: dict[BackendKind, BackendEntry] = {
    "dummy": BackendEntry(load_dummy, builds_model=False),
    "distro": BackendEntry(load_distro),
    "parallel": BackendEntry(load_parallel),
}


def with_distro_backend(
    backend: type[DistroBackend], backends: Mapping[BackendKind, BackendEntry] = BACKENDS
) -> dict[BackendKind, BackendEntry]:
    """`backends` with the distro entry loading `backend`, a `DistroBackend` subclass."""
    return {**backends, "distro": BackendEntry(partial(load_distro_as, backend))}
