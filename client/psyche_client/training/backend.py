"""The training backend interface of the round pipeline, and the dummy backend for tests.

The round runner never touches torch: it calls a `TrainingBackend` from a worker thread
(`asyncio.to_thread`). `DistroBackend` (psyche_client.training.distro_backend) wraps the real trainer;
`DummyBackend` (`--dummy-training-delay-secs`) sleeps instead of training and produces tiny
fake results, so protocol-level runs are fast and still prove that every client applies the
same results in the same order (its "weights" are a hash chain over what was applied).

Every backend declares what it supports beyond training in one typed value,
`TrainingBackend.capabilities` (`Capabilities`: its model's description, a result verifier,
the live model for evals, optimizer statistics; None where it has none), so no caller asks a
backend's type what it can do.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt
from psyche_common.batch_id import BatchId

if TYPE_CHECKING:  # the round pipeline imports this module without torch
    import torch

    from psyche_client.training.model.loading import ModelInfo


def result_commitment(step: int, batch: BatchId, payload_digest_input: bytes) -> bytes:
    """SHA-256 over ``step (BE u32) ‖ start (BE u64) ‖ end (BE u64) ‖ bytes``."""
    header = struct.pack(">IQQ", step, batch.start, batch.end)
    return hashlib.sha256(header + payload_digest_input).digest()


@dataclass
class TrainedResult:
    """One trained batch as the round pipeline publishes it: the loss, the bytes to send and
    their commitment, and how many tokens it trained on."""

    loss: float
    payload: bytes
    data_hash: bytes
    tokens: int


class DecodedResult(Protocol):
    """A peer's result after `TrainingBackend.decode` verified it: what `apply` takes."""

    @property
    def trainer_nonce(self) -> int:
        """How many results its trainer had produced before (cold-start filtering)."""
        ...


WeightsSnapshot = object
"""What `TrainingBackend.snapshot` returns; only `restore` reads it."""

Samples = npt.NDArray[np.int64]
"""A batch's token sequences, `(samples, seq_len)`."""

Reference = list[npt.NDArray[np.float32]]
"""A verifier's reference of one batch (`ResultVerifier.recompute`): per parameter, the DCT
coefficients of the plain gradient."""

WarmupBounds = tuple[int, int]
"""The cold-start warmup of an epoch: ``(start, end)``, the steps whose learning rate ramps
up from 0 (`Coordinator.get_cold_start_warmup_bounds`, `lr_schedule.cold_start_factor`)."""


@dataclass(frozen=True)
class DummyResult:
    """`DummyBackend`'s decoded result: the verified payload."""

    payload: bytes
    trainer_nonce: int = 0


class ResultVerifier(Protocol):
    """Checks peers' results (DisTrO): `recompute` the reference of one batch on the current
    weights (weights unchanged), then score a result against it."""

    def recompute(
        self, samples: Samples, step: int = 0, along: DecodedResult | None = None
    ) -> Reference | None:
        """The reference of a batch's samples at the point its trainer of step `step` trained
        at (its lookahead along `along`, its published result of step − 1, when given); None
        when this run's optimizer has none."""
        ...

    def agreement(self, reference: Reference, result: DecodedResult) -> float:
        """How well `result` agrees with `reference`, in [0, 1]; ValueError if it cannot."""
        ...

    def overlap(self, result: DecodedResult, other: DecodedResult) -> float:
        """Share of `result`'s chosen positions that `other` chose too, in [0, 1];
        ValueError if the two cannot be compared."""
        ...


OptimStats = list[tuple[int, dict[str, float]]]
"""Optimizer statistics per measured step, oldest first (`--optim-stats-steps`)."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend supports beyond training and applying: each is None where it does not
    (the dummy backend supports none of them)."""

    model_info: ModelInfo | None = None
    """Where the backend's real model came from (its config is what late joiners get)."""
    verifier: ResultVerifier | None = None
    """How this backend checks peers' results (a verifier's work, docs/verification.md)."""
    live_model: Callable[[], torch.nn.Module] | None = None
    """The model being trained, as it is now, when it lives in this process (evals run on
    it)."""
    optim_stats: Callable[[], OptimStats] | None = None
    """The optimizer statistics measured since the last call (callable from any thread)."""


class TrainingBackend(Protocol):
    """What the round pipeline needs from a model + optimizer. All methods may block."""

    @property
    def capabilities(self) -> Capabilities:
        """What else this backend supports (fixed once it is loaded)."""
        ...

    def train(
        self, step: int, batch: BatchId, samples: Samples | None, cancelled: Callable[[], bool]
    ) -> TrainedResult | None:
        """Train one batch (``samples`` is None only for a backend that trains without data);
        None when ``cancelled()`` turned true (weights left unchanged)."""
        ...

    def decode(self, step: int, batch: BatchId, payload: bytes, data_hash: bytes) -> DecodedResult:
        """Verify ``payload`` against its commitment and decode it; raise ValueError if bad."""
        ...

    def apply(self, step: int, results: Sequence[DecodedResult]) -> None: ...

    def result_size(self) -> int:
        """The exact byte size of every result of this run (its layout fixes it): a peer's
        announcement of any other size is refused before its bytes are fetched."""
        ...

    def snapshot(self) -> WeightsSnapshot:
        """A copy of the weights that `restore` puts back exactly (an apply done early for a
        round that then did not happen is undone with it)."""
        ...

    def restore(self, snapshot: WeightsSnapshot) -> None: ...

    def begin_round(self, warmup_bounds: WarmupBounds | None) -> None:
        """A round starts, in an epoch with these cold-start warmup bounds (called on the
        event loop; must be quick)."""
        ...

    def cancel_round(self) -> None:
        """A trained result was not published: forget it (no error feedback from it)."""
        ...

    def weights_hash(self) -> bytes: ...

    def export_parameters(self) -> list[tuple[str, str, tuple[int, ...], bytes]]:
        """``(name, dtype, shape, raw bytes)`` of every parameter, for model sharing."""
        ...

    def load_parameters(self, parameters: dict[str, bytes]) -> None:
        """Overwrite the weights from peer-fetched ``export_parameters`` bytes."""
        ...

    def save_checkpoint(self, directory: str) -> None: ...


def shared_config_json(capabilities: Capabilities) -> str:
    """The model config shared with late joiners, as JSON ("" for a backend without a real
    model)."""
    info = capabilities.model_info
    return "" if info is None else json.dumps(info.config, sort_keys=True)


PADDING_PARAMETER = 1 << 20
"""Bytes per `dummy.padding.N` parameter of a `DummyBackend` with a `model_size`."""


class DummyBackend:
    """A stand-in model: sleeps ``delay_secs`` per batch plus ``seconds_per_sample`` per
    sample of it; weights are a 32-byte hash chain.

    Results are ``result_size`` bytes (64 by default; network tests give the size of a real
    model's results). With ``model_size`` the shared model also carries that many bytes
    derived from the weights (``dummy.padding.N``), so sharing it moves as many bytes as a
    real model would; a peer's padding must match its weights."""

    PAYLOAD_SIZE = 64
    CANCEL_POLL_SECS = 0.05
    """A long sleep looks at its round's cancellation this often."""

    def __init__(
        self,
        delay_secs: float,
        weights: bytes | None = None,
        *,
        seconds_per_sample: float = 0.0,
        result_size: int = PAYLOAD_SIZE,
        model_size: int = 0,
    ) -> None:
        if result_size < 1 or model_size < 0:
            raise ValueError(f"dummy sizes must be positive: {result_size=}, {model_size=}")
        if delay_secs < 0 or seconds_per_sample < 0:
            raise ValueError(
                f"dummy delays must not be negative: {delay_secs=}, {seconds_per_sample=}"
            )
        self.delay_secs = delay_secs
        self.seconds_per_sample = seconds_per_sample
        self.weights = weights or hashlib.sha256(b"psyche-py dummy model").digest()
        self.applied_steps = 0
        self.payload_size = result_size
        self.model_size = model_size

    capabilities = Capabilities()

    def train(
        self, step: int, batch: BatchId, samples: Samples | None, cancelled: Callable[[], bool]
    ) -> TrainedResult | None:
        deadline = time.monotonic() + self.delay_secs + self.seconds_per_sample * len(batch)
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, self.CANCEL_POLL_SECS))
            if cancelled():
                return None
        if cancelled():
            return None
        seed = hashlib.sha256(self.weights + struct.pack(">IQQ", step, batch.start, batch.end))
        if self.payload_size == self.PAYLOAD_SIZE:
            payload = seed.digest() * 2
        else:
            payload = hashlib.shake_256(seed.digest()).digest(self.payload_size)
        loss = 10.0 / (1.0 + 0.1 * (self.applied_steps + 1))
        return TrainedResult(
            loss=loss,
            payload=payload,
            data_hash=result_commitment(step, batch, payload),
            tokens=len(batch),
        )

    def decode(self, step: int, batch: BatchId, payload: bytes, data_hash: bytes) -> DummyResult:
        if len(payload) != self.payload_size:
            raise ValueError(f"dummy result must be {self.payload_size} bytes, got {len(payload)}")
        if result_commitment(step, batch, payload) != data_hash:
            raise ValueError(f"result for {batch} at step {step} does not match its commitment")
        return DummyResult(payload)

    def result_size(self) -> int:
        return self.payload_size

    def apply(self, step: int, results: Sequence[DecodedResult]) -> None:
        digest = hashlib.sha256(self.weights + struct.pack(">I", step))
        for result in results:
            if not isinstance(result, DummyResult):
                raise TypeError(f"DummyBackend cannot apply a {type(result).__name__}")
            digest.update(result.payload)
        self.weights = digest.digest()
        self.applied_steps += 1

    def snapshot(self) -> WeightsSnapshot:
        return (self.weights, self.applied_steps)

    def restore(self, snapshot: WeightsSnapshot) -> None:
        assert isinstance(snapshot, tuple)
        self.weights, self.applied_steps = snapshot

    def cancel_round(self) -> None:
        return None

    def begin_round(self, warmup_bounds: WarmupBounds | None) -> None:
        return None

    def weights_hash(self) -> bytes:
        return hashlib.sha256(self.weights).digest()

    def export_parameters(self) -> list[tuple[str, str, tuple[int, ...], bytes]]:
        entries: list[tuple[str, str, tuple[int, ...], bytes]] = [
            ("dummy.weights", "uint8", (len(self.weights),), self.weights)
        ]
        padding = _padding(self.weights, self.model_size)
        for index, offset in enumerate(range(0, len(padding), PADDING_PARAMETER)):
            part = padding[offset : offset + PADDING_PARAMETER]
            entries.append((f"dummy.padding.{index}", "uint8", (len(part),), part))
        return entries

    def load_parameters(self, parameters: dict[str, bytes]) -> None:
        weights = parameters.get("dummy.weights")
        if weights is None or len(weights) != 32:
            raise ValueError("peer model has no 32-byte 'dummy.weights' parameter")
        parts = sorted(
            (int(name.rsplit(".", 1)[1]), data)
            for name, data in parameters.items()
            if name.startswith("dummy.padding.")
        )
        padding = b"".join(data for _, data in parts)
        if [i for i, _ in parts] != list(range(len(parts))) or padding != _padding(
            weights, len(padding)
        ):
            raise ValueError("peer model's 'dummy.padding.N' parameters do not match its weights")
        self.weights = weights

    def save_checkpoint(self, directory: str) -> None:
        import pathlib

        path = pathlib.Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        (path / "dummy.weights").write_bytes(self.weights)


def _padding(weights: bytes, size: int) -> bytes:
    """`DummyBackend`'s model-size padding: `size` bytes derived from the weights (shared
    as parameters of `PADDING_PARAMETER` bytes, like a real model's many tensors, so a joiner
    fetches them from several peers at once)."""
    return hashlib.shake_256(b"psyche-py dummy padding" + weights).digest(size)
