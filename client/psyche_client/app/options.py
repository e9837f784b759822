"""`ClientOptions`: everything `psyche-client train` configures, in sections that are the
parts' own settings types — `P2PConfig` for the node, `RetryPolicy` for the data fetcher,
`BackendOptions` (with its `ParallelSpec`) for the backend registry, `CheckpointOptions` for
the Cooldown, `RunnerOptions` for the round pipeline, `EvalOptions` for the evals,
`MetricsOptions` for the metrics sink — plus the server session's.

Each section's defaults are the flags' defaults (`app.flags.FLAGS`), applied over the
section type's own: a `P2PConfig` built for the client downloads 4 results at once, as
`--max-concurrent-downloads` says, not the node's default 8.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from psyche_common import flag_table
from psyche_common.data.retry import RetryPolicy
from psyche_common.protocol import Identity

from psyche_client.app.flags import FLAGS
from psyche_client.evals.options import EvalOptions
from psyche_client.metrics.options import MetricsOptions
from psyche_client.p2p.config import P2PConfig
from psyche_client.round.ports import RunnerOptions
from psyche_client.training.parallel.plan import ParallelSpec
from psyche_client.weights.backends import BackendOptions
from psyche_client.weights.lifecycle import CheckpointOptions

T = TypeVar("T")


@dataclass(frozen=True)
class ServerOptions:
    """The coordinator server: its address, the run to join, how long to reconnect."""

    addr: str
    run_id: str
    reconnect_timeout: float = 600.0
    """Seconds to keep reconnecting after losing the server (0: exit at once)."""
    exit_when_finished: bool = True
    authorization: bytes | None = None
    """A signed authorization statement sent with the Join (`--authorization`)."""
    server_key: bytes | None = None
    """The server's identity key (`--server-key`): any other server is refused."""


def section(base: T, prefix: str, values: Mapping[str, object] | None = None) -> T:
    """`base` (a dataclass) with the fields the flags of `prefix` set."""
    return flag_table.with_flags(base, FLAGS, prefix, values)


def client_p2p_config(**changes: object) -> P2PConfig:
    """The node settings the flags give by default, with `changes`."""
    return dataclasses.replace(section(P2PConfig(), "p2p"), **changes)  # type: ignore[arg-type]


def _backend(values: Mapping[str, object] | None = None) -> BackendOptions:
    parallel = section(ParallelSpec(), "backend.parallel", values)
    return section(BackendOptions(parallel=parallel), "backend", values)


@dataclass(frozen=True)
class ClientOptions:
    """Everything `psyche-client train` configures (see `app.flags` for each flag)."""

    server: ServerOptions
    identity: Identity
    p2p: P2PConfig = field(default_factory=client_p2p_config)
    backend: BackendOptions = field(default_factory=_backend)
    data: RetryPolicy = field(default_factory=lambda: section(RetryPolicy(), "data"))
    checkpointing: CheckpointOptions = field(
        default_factory=lambda: section(CheckpointOptions(), "checkpointing")
    )
    round: RunnerOptions = field(default_factory=lambda: section(RunnerOptions(), "round"))
    evals: EvalOptions = field(default_factory=lambda: section(EvalOptions(), "evals"))
    metrics: MetricsOptions = field(default_factory=lambda: section(MetricsOptions(), "metrics"))

    @classmethod
    def from_flags(cls, values: Mapping[str, object], identity: Identity) -> ClientOptions:
        """The options from `train`'s parsed flag values (by Python name, e.g.
        `gossip_fanout`; a missing one takes its default)."""
        server = section(
            ServerOptions(str(values["server_addr"]), str(values["run_id"])), "server", values
        )
        return cls(
            server=server,
            identity=identity,
            p2p=section(P2PConfig(), "p2p", values),
            backend=_backend(values),
            data=section(RetryPolicy(), "data", values),
            checkpointing=section(CheckpointOptions(), "checkpointing", values),
            round=section(RunnerOptions(), "round", values),
            evals=section(EvalOptions(), "evals", values),
            metrics=section(MetricsOptions(), "metrics", values),
        )
