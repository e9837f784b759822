"""Local training of one client: micro-batched forward/backward, clipping, the optimizer step.

Reference: spec sections 1.5, 2.5.3-2.5.5, 2.9. The client's round pipeline calls, from one
worker thread (the methods are not re-entrant):

    trainer = Trainer(model, optimizer_config, device=device, micro_batch_size=4)
    # start of round h (coordinator step S): results of step S-2, own result included
    trainer.apply(results, step=S, lr=lr(S))           # canonical batch-id order inside
    out = trainer.train(batch_id, tokens, step=S, lr=lr(S), prev_lr=lr(S-1))
    out.result.encode()  /  out.result.data_hash()     # publish; keep nothing else
    trainer.drop_pending_result()                      # only if the result was NOT published
    trainer.weights_hash()                             # == model.loading.weights_hash(model)

`train` hands one step to the run's optimizer (`optimizers`: one `TrainingOptimizer`
interface, the variant found by name in `optimizers.registry` from the run config's table or
from settings built in code), lending it the forward/backward over micro-batches of
`micro_batch_size` samples (each micro-batch's mean loss weighted by its share of the
tokens) and the gradient clip (global L2). DisTrO (`optimizers.distro`)
trains at the lookahead point (theta - prev_lr*sign(delta); only when this trainer trained
the step before, whose result is still in flight: `distro.in_flight`), restores the exact
weights, clips and generates the result; its own unquantized result is remembered and
subtracted from the momentum at the next `train` (error feedback). SparseLoCo
(`optimizers.sparseloco`) splits the samples into `inner_steps` equal parts and takes one
local AdamW step per part, then generates the result from the pseudo-gradient. AdamW
(`optimizers.adamw`) steps directly and returns no result (central or comparison runs);
`apply` is for the optimizers that share results. The parameters and gradients keep the
model's dtype (bf16 or fp32; with `grad_accum_in_fp32` the micro-batch gradients are summed in
float32 and rounded once); the momentum is float32 (`training.model.precision` says what
stays in fp32 and why).

Data parallelism: `train(..., sync=...)` takes a `GradientSync` (implemented in
`psyche_client.training.parallel.collectives`) when `tokens` is one rank's share of a batch
that several ranks train together. Micro-batch weights then use the whole batch's sample count;
before each micro-batch the rank asks `sync` whether to stop (a cancellation seen by one rank
reaches the others without waiting for them); after its micro-batches `sync.reduce` either sums
the gradients and loss sums over the ranks (before clipping and `generate`) or, when any rank
stopped, tells every rank to raise `TrainingCancelled`.

API: `AdamWSettings`, `optimizer_settings(config)` (from `optimizers`), `TrainOutput`,
`TrainingCancelled`, `GradientSync`, `Fp32GradAccumulator`,
`Trainer(model, optimizer, *, device, micro_batch_size, dtype=None, grad_accum_in_fp32=False)`
with
`.train(...)`,
`.apply(results, step, lr) -> int`, `.evaluate(tokens) -> float`, `.decode_result(data)`,
`.drop_pending_result()`, `.reset_optimizer_state()`, `.weights_hash() -> bytes`
(= `.weights_digest()`), `.layout`, `.optimizer` (the `TrainingOptimizer`), `.distro` (the
compressed optimizer whose results it shares), and
`weights_digest(model) -> bytes` (same value as `model.loading.weights_hash`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from psyche_common.batch_id import BatchId

from psyche_client.distro import DistroResult, ResultLayout
from psyche_client.training.model.loading import weights_hash
from psyche_client.training.optim_stats import OptimStatsRecorder, results_index_overlap
from psyche_client.training.optimizers.adamw import AdamWSettings
from psyche_client.training.optimizers.base import (
    OptimizerSettings,
    Pass,
    SharedResults,
    StepRequest,
    TrainingOptimizer,
)
from psyche_client.training.optimizers.registry import optimizer_settings, optimizer_spec

__all__ = [
    "AdamWSettings",
    "Fp32GradAccumulator",
    "OptimizerSettings",
    "TrainOutput",
    "Trainer",
    "TrainingCancelled",
    "optimizer_settings",
    "weights_digest",
]

logger = logging.getLogger(__name__)

_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


class TrainingCancelled(RuntimeError):
    """`train` stopped before a micro-batch because the round was cancelled; weights and
    momentum are as they were before the call."""


class GradientSync(Protocol):
    """How one data-parallel rank's `train` call meets the other ranks training the same batch."""

    @property
    def batch_samples(self) -> int:
        """Samples in the whole batch, over every rank (the micro-batch weights' denominator)."""
        ...

    def should_stop(self, local: bool) -> bool:
        """Before each of this rank's micro-batches (not collective): True when this rank
        (`local`, which the other ranks are then told about) or another one stopped."""
        ...

    def reduce(
        self,
        params: Sequence[torch.nn.Parameter],
        loss_sum: float,
        counted: int,
        stopped: bool,
    ) -> tuple[float, int] | None:
        """Collective, once after the micro-batches: None on every rank when any rank stopped;
        otherwise sum every parameter's gradient (None counts as zeros) and the loss sums over
        the ranks, in place, and return the summed `(loss_sum, counted)`."""
        ...


NamedParameters = Sequence[tuple[str, torch.nn.Parameter]]


@dataclass(frozen=True)
class TrainOutput:
    loss: float
    result: DistroResult | None
    grad_norm: float | None
    micro_batches: int
    skipped_micro_batches: int
    forward_backward_seconds: float
    optimizer_seconds: float


def weights_digest(model: torch.nn.Module) -> bytes:
    """The 32-byte weights hash: `model.loading.weights_hash` (sorted names; name, dtype, shape
    and raw bytes of every parameter), so every part of the client reports the same value."""
    return weights_hash(model)


class Fp32GradAccumulator:
    """`--grad-accum-in-fp32`: the micro-batches' gradients summed in float32 buffers (each
    micro-batch's gradient moves into the sum, so a bf16 `.grad` never holds a partial sum),
    then rounded once into the parameters' `.grad` (the reference does the same)."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self._params = list(params)
        self._sums: list[torch.Tensor | None] = [None] * len(self._params)

    @classmethod
    def for_params(cls, params: Sequence[torch.nn.Parameter]) -> Fp32GradAccumulator | None:
        """An accumulator, or None when every parameter already is float32 (nothing to gain)."""
        if all(p.dtype == torch.float32 for p in params):
            return None
        return cls(params)

    @torch.no_grad()
    def collect(self) -> None:
        """Move every `.grad` into the float32 sums (after a micro-batch's backward)."""
        for i, p in enumerate(self._params):
            if p.grad is None:
                continue
            total = self._sums[i]
            if total is None:
                self._sums[i] = p.grad.to(torch.float32)
            else:
                total.add_(p.grad)
            p.grad = None

    @torch.no_grad()
    def release(self) -> None:
        """Put the sums into `.grad`, in the parameters' dtype, and drop the buffers."""
        for i, p in enumerate(self._params):
            total = self._sums[i]
            if total is not None:
                p.grad = total.to(p.dtype)
        self._sums = [None] * len(self._params)


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: object,
        *,
        device: torch.device | str,
        micro_batch_size: int,
        dtype: torch.dtype | str | None = None,
        grad_accum_in_fp32: bool = False,
        optim_stats_steps: int = 0,
    ) -> None:
        """`optimizer`: the run config's optimizer table, or settings of a registered
        variant (`optimizers.registry`)."""
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.device = torch.device(device)
        self.dtype = _resolve_dtype(dtype)
        self.model = model.to(device=self.device, dtype=self.dtype)
        self.micro_batch_size = micro_batch_size
        self.grad_accum_in_fp32 = grad_accum_in_fp32
        spec = optimizer_spec(optimizer)
        self.settings: OptimizerSettings = spec.settings_for(optimizer)
        self.trainer_nonce = 0
        self.optim_stats = OptimStatsRecorder(optim_stats_steps)
        self._params = sorted(self.model.named_parameters(), key=lambda item: item[0])
        self.optimizer: TrainingOptimizer = spec.build(self.settings, self._params)

    # ---- properties ----------------------------------------------------------------------
    @property
    def is_distro(self) -> bool:
        """True when training produces results to share (DisTrO or SparseLoCo)."""
        return self.optimizer.shared is not None

    @property
    def layout(self) -> ResultLayout:
        """The layout every result of this run must have (DisTrO only)."""
        return self._require_distro().layout

    @property
    def distro(self) -> SharedResults:
        """The compressed optimizer whose results this trainer shares and applies."""
        return self._require_distro()

    # ---- training ------------------------------------------------------------------------
    def train(
        self,
        batch_id: BatchId,
        tokens: np.ndarray,
        step: int,
        lr: float,
        prev_lr: float,
        *,
        zero_optim: bool = False,
        cancelled: Callable[[], bool] | None = None,
        sync: GradientSync | None = None,
    ) -> TrainOutput:
        """Train on `tokens` (int64, `(n, seq_len)`) for coordinator `step` (see module doc).

        Raises `TrainingCancelled` when `cancelled()` turns true before a micro-batch (with
        `sync`: on any rank); the weights are then restored and the momentum is untouched.
        With `sync`, `tokens` is this rank's share of the batch and may have no rows.
        """
        input_ids = self._to_input(tokens, allow_empty=sync is not None)
        nonce = self.trainer_nonce
        self.trainer_nonce += 1
        self.model.train()
        self.model.zero_grad(set_to_none=True)
        request = StepRequest(
            batch_id, step, lr, prev_lr, nonce, zero_optim, self.optim_stats.due(step)
        )
        passes = _Passes(self, input_ids, cancelled, sync)
        started = time.perf_counter()
        try:
            outcome = self.optimizer.step(request, passes)
        except TrainingCancelled:
            self.model.zero_grad(set_to_none=True)
            raise
        self.optim_stats.record(step, outcome.stats)
        self.model.zero_grad(set_to_none=True)
        return TrainOutput(
            loss=outcome.loss,
            result=outcome.result,
            grad_norm=outcome.grad_norm,
            micro_batches=outcome.micro_batches,
            skipped_micro_batches=outcome.skipped_micro_batches,
            forward_backward_seconds=passes.seconds,
            optimizer_seconds=time.perf_counter() - started - passes.seconds,
        )

    def _forward_backward(
        self,
        input_ids: torch.Tensor,
        cancelled: Callable[[], bool] | None,
        sync: GradientSync | None = None,
    ) -> tuple[float, int, int]:
        total = input_ids.shape[0] if sync is None else sync.batch_samples
        loss_sum = 0.0
        counted = 0
        skipped = 0
        micro_batches = (
            torch.split(input_ids, self.micro_batch_size, dim=0) if len(input_ids) else ()
        )
        stopped = False
        accumulator = (
            Fp32GradAccumulator.for_params([p for _, p in self._params])
            if self.grad_accum_in_fp32 and len(micro_batches) > 1
            else None
        )
        for micro_batch in micro_batches:
            stop = cancelled is not None and cancelled()
            if sync is not None:
                stop = sync.should_stop(stop)
            if stop:
                if sync is None:
                    raise TrainingCancelled("training cancelled before a micro-batch")
                stopped = True
                break
            loss = self.model(input_ids=micro_batch, labels=micro_batch).loss
            weight = micro_batch.shape[0] / total  # equal-length samples: share of tokens
            value = float(loss.detach())
            if not math.isfinite(value):
                skipped += 1
                logger.warning("skipping a micro-batch with non-finite loss %s", value)
                continue
            (loss * weight).backward()
            if accumulator is not None:
                accumulator.collect()
            loss_sum += value * weight
            counted += micro_batch.shape[0]
        if accumulator is not None:
            accumulator.release()
        if sync is not None:
            reduced = sync.reduce([p for _, p in self._params], loss_sum, counted, stopped)
            if reduced is None:
                raise TrainingCancelled("training cancelled on a rank before a micro-batch")
            loss_sum, counted = reduced
        mean_loss = loss_sum * total / counted if counted else math.nan
        _wait_for_device(self.device)  # the backward's kernels belong to the timed span
        return mean_loss, len(micro_batches), skipped

    def _clip(self) -> float | None:
        max_norm = self.settings.clip_grad_norm
        if max_norm is None or max_norm <= 0:
            return None
        params = [p for _, p in self._params if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    # ---- applying peers' results ---------------------------------------------------------
    def apply(self, results: Sequence[DistroResult], step: int, lr: float) -> int:
        """Apply results (own included) with the lr of the applying `step`; returns the count.

        The input order does not matter: results are sorted by batch id, so every client
        applying the same set gets bit-identical weights.
        """
        distro = self._require_distro()
        if not results:
            logger.warning("step %d: no DisTrO results to apply, weights unchanged", step)
            return 0
        if self.optim_stats.due(step):
            try:
                self.optim_stats.record(step, results_index_overlap(distro.layout, results))
            except (ValueError, IndexError) as exc:  # statistics never stop an apply
                logger.warning("step %d: no index overlap statistics: %s", step, exc)
        return distro.apply(results, lr)

    def decode_result(self, data: bytes) -> DistroResult:
        """Strictly decode a received result for this model (raises `ResultDecodeError`)."""
        return DistroResult.decode(data, self.layout)

    def reset_optimizer_state(self) -> None:
        """Zero the DisTrO momentum (or SparseLoCo state) and forget the pending own result:
        the weights were replaced, and what was accumulated on the old ones does not apply."""
        self.optimizer.reset()

    def drop_pending_result(self) -> None:
        """Forget the last own result (it was not published, so it stays in the momentum)."""
        self.optimizer.drop_pending()

    # ---- evaluation and hashing ----------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, tokens: np.ndarray) -> float:
        """Mean causal-LM loss over `tokens` (`(n, seq_len)`), in micro-batches."""
        input_ids = self._to_input(tokens)
        self.model.eval()
        total = 0.0
        for micro_batch in torch.split(input_ids, self.micro_batch_size, dim=0):
            loss = self.model(input_ids=micro_batch, labels=micro_batch).loss
            total += float(loss) * micro_batch.shape[0]
        return total / input_ids.shape[0]

    def weights_digest(self) -> bytes:
        return weights_digest(self.model)

    def weights_hash(self) -> bytes:
        return self.weights_digest()

    # ---- helpers -------------------------------------------------------------------------
    def _require_distro(self) -> SharedResults:
        shared = self.optimizer.shared
        if shared is None:
            raise RuntimeError(
                f"this trainer's optimizer ({self.optimizer.name}) shares no results; "
                "DisTrO results do not apply"
            )
        return shared

    def _to_input(self, tokens: np.ndarray, allow_empty: bool = False) -> torch.Tensor:
        array = np.asarray(tokens)
        min_rows = 0 if allow_empty else 1
        if array.ndim != 2 or array.shape[0] < min_rows or array.shape[1] < 2:
            raise ValueError(f"tokens must have shape (n >= 1, seq_len >= 2), got {array.shape}")
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"tokens must be integers, got dtype {array.dtype}")
        return torch.from_numpy(array.astype(np.int64, copy=False)).to(self.device)


class _Passes:
    """What a `Trainer` lends its optimizer for one `train` call (`optimizers.base.Passes`);
    it also adds up the forward/backward time of the call."""

    def __init__(
        self,
        trainer: Trainer,
        samples: torch.Tensor,
        cancelled: Callable[[], bool] | None,
        sync: GradientSync | None,
    ) -> None:
        self._trainer = trainer
        self._samples = samples
        self._cancelled = cancelled
        self._sync = sync
        self.seconds = 0.0

    @property
    def samples(self) -> torch.Tensor:
        return self._samples

    def whole_batch(self) -> Pass:
        return self._timed(self._samples, self._sync)

    def part(self, input_ids: torch.Tensor) -> Pass:
        return self._timed(input_ids, None)

    def _timed(self, input_ids: torch.Tensor, sync: GradientSync | None) -> Pass:
        started = time.perf_counter()
        try:
            loss, used, skipped = self._trainer._forward_backward(input_ids, self._cancelled, sync)
        finally:
            self.seconds += time.perf_counter() - started
        return Pass(loss, used, skipped)

    def clip(self) -> float | None:
        return self._trainer._clip()

    def zero_grad(self) -> None:
        self._trainer.model.zero_grad(set_to_none=True)


def _wait_for_device(device: torch.device) -> None:
    """Wait for the kernels queued on `device` (CUDA runs them asynchronously), so that the
    forward/backward time a step reports holds its backward rather than the optimizer's; the
    gradient clipping right after waits for them anyway. Nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None
