"""SparseLoCo: several local AdamW steps per round; the pseudo-gradient travels as a result.

A DiLoCo-style optimizer (Sarfi et al. 2025, "Communication Efficient LLM Pre-training with
SparseLoCo") in DisTrO's round pipeline and result format. Per round (coordinator step S) a
client, driven by the `Trainer`:

    with opt.local_round(own_pending):     # save theta; start from the lookahead point
        for each of `inner_steps` parts of the batch:
            forward/backward, clip
            opt.inner_step(lr)             # one AdamW step (local moments, kept across rounds)
    # on exit: pseudo-gradient = start - end; theta restored exactly
    generated = opt.generate(step, batch_id, trainer_nonce, own_previous)
        # e <- beta * (e - decode(own_previous)) + pseudo-gradient; e -> DCT, top-k, quantize;
        # generated.own holds the values exactly as receivers read them, so what
        # quantization lost stays in e (error feedback)
    opt.apply(results, lr)                 # theta <- theta - outer_lr * mean_r decode(result_r)

The lookahead point is `theta - outer_lr * decode(own_pending)`: the client's own result of
step S-1, which is still in flight, as the estimate of that step's update (DisTrO uses
`sign(delta)` the same way). `apply` averages over all results (a result that did not choose
a coefficient counts as 0 there; with `mean_over_choosers`, over the results that chose it), aggregates exactly and inverts the DCT in float64 like
DisTrO, then rounds the update to bf16 before it touches the weights: devices whose float64
matmuls differ in the last bits would have to straddle a bf16 rounding boundary to disagree.
Only `apply` changes the weights, so clients applying the same results stay bit-identical;
the AdamW moments and the error-feedback buffer (float32 whatever the parameter dtype) are
local.

API: `SparseLocoSettings` (+ `from_config`), `SparseLocoOptimizer(named_parameters,
settings)` with `.layout`, `.local_round(own_pending)`, `.inner_step(lr)`, `.generate(...)`,
`.apply(results, lr) -> int`, `.zero_state()`, `.error_buffer(name)`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from psyche_common.batch_id import BatchId
from psyche_common.config import SparseLocoOptimizer as SparseLocoConfig
from psyche_common.config.optimizer import SPARSELOCO_CLASHES, SPARSELOCO_SPELLINGS
from psyche_common.config.value_format import resolve_value_format

from psyche_client.distro.compressor import canonical_order
from psyche_client.distro.optimizer import Generated, OwnResult
from psyche_client.distro.parameters import compressed_parameters, zero_buffers
from psyche_client.distro.result import DistroResult, ResultLayout
from psyche_client.distro.values import ValueKind, value_kind_named


@dataclass(frozen=True)
class SparseLocoSettings:
    """The knobs of the `SparseLoCo` optimizer config."""

    inner_steps: int
    outer_lr: float
    compression_decay: float
    compression_topk: int
    compression_chunk: int
    quantize_2bit: bool = True
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_grad_norm: float | None = 1.0
    mean_over_choosers: bool = False
    """Average each coefficient over the results that chose it (Templar's SparseLoCo) rather
    than over all results (a result that did not choose it counting as 0)."""
    clip_to_median: bool = False
    """Scale a result's tensor down to the results' median RMS but never up (Templar's
    median-norm clipping) instead of normalising every result to it (`influence`)."""
    dct: bool = True
    """Compress each tile's DCT coefficients; False: its raw values (Templar's SparseLoCo)."""
    quantize_codebook: bool = False
    """With `quantize_2bit`: the four levels at the magnitudes' mean +- their standard
    deviation per chunk (`ValueKind.TWO_BIT_CODEBOOK`) instead of `s/3` and `s` of the
    largest."""
    quantize_4bit: bool = False
    """4-bit values (`ValueKind.FOUR_BIT`) instead of 2-bit or bf16 ones."""

    def __post_init__(self) -> None:
        if self.inner_steps < 1:
            raise ValueError(f"inner_steps must be >= 1, got {self.inner_steps}")
        if not self.outer_lr > 0:
            raise ValueError(f"outer_lr must be > 0, got {self.outer_lr}")
        if self.compression_topk < 1:
            raise ValueError(f"compression_topk must be >= 1, got {self.compression_topk}")
        if self.compression_chunk < 1:
            raise ValueError(f"compression_chunk must be >= 1, got {self.compression_chunk}")
        self.value_kind  # noqa: B018  (raises ValueFormatConflict on clashing booleans)

    @property
    def value_kind(self) -> ValueKind:
        """The value format the booleans spell (as in a SparseLoCo table without
        `value_format`)."""
        given = {
            "quantize_2bit": self.quantize_2bit,
            "quantize_codebook": self.quantize_codebook,
            "quantize_4bit": self.quantize_4bit,
        }
        named = resolve_value_format(
            "SparseLocoSettings", None, given, SPARSELOCO_SPELLINGS, SPARSELOCO_CLASHES
        )
        return value_kind_named(named)

    @classmethod
    def from_config(cls, config: SparseLocoConfig) -> SparseLocoSettings:
        """From the run config's `SparseLoCo` optimizer table (its value format spelled by
        the booleans these settings keep)."""
        beta1, beta2 = config.betas
        spelled = SPARSELOCO_SPELLINGS[config.resolved_value_format()]
        return cls(
            inner_steps=int(config.inner_steps),
            outer_lr=float(config.outer_lr),
            compression_decay=float(config.compression_decay),
            compression_topk=int(config.compression_topk),
            compression_chunk=int(config.compression_chunk),
            quantize_2bit=spelled["quantize_2bit"],
            quantize_codebook=spelled["quantize_codebook"],
            quantize_4bit=spelled["quantize_4bit"],
            betas=(float(beta1), float(beta2)),
            eps=float(config.eps),
            weight_decay=float(config.weight_decay),
            clip_grad_norm=config.clip_grad_norm,
            mean_over_choosers=bool(config.mean_over_choosers or False),
            clip_to_median=bool(config.clip_to_median or False),
            dct=config.dct is not False,
        )


class SparseLocoOptimizer:
    def __init__(
        self,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
        settings: SparseLocoSettings,
    ) -> None:
        self.settings = settings
        self._params, self.compressor = compressed_parameters(
            named_parameters, settings, clip_influence=settings.clip_to_median, dct=settings.dct
        )
        self._error = zero_buffers(self._params)
        self._inner = self._new_inner_optimizer()
        self._pseudo: list[torch.Tensor] | None = None

    @property
    def layout(self) -> ResultLayout:
        return self.compressor.layout

    def _new_inner_optimizer(self) -> torch.optim.AdamW:
        return torch.optim.AdamW(
            [p for _, p in self._params],
            lr=0.0,
            betas=self.settings.betas,
            eps=self.settings.eps,
            weight_decay=self.settings.weight_decay,
        )

    # ---- state -------------------------------------------------------------------------
    def zero_state(self) -> None:
        """Forget the error feedback and the AdamW moments (a fresh start)."""
        for error in self._error:
            error.zero_()
        self._inner = self._new_inner_optimizer()

    def error_buffer(self, name: str) -> torch.Tensor:
        index = [n for n, _ in self._params].index(name)
        return self._error[index]

    # ---- the local round ---------------------------------------------------------------
    @contextmanager
    def local_round(self, own_pending: Sequence[OwnResult] = ()) -> Iterator[None]:
        """Run the inner steps from the lookahead point; see the module docstring.

        On normal exit the pseudo-gradient is kept for `generate`. If the body raises, the
        AdamW moments are restored too, so a cancelled round leaves no trace.
        """
        saved = [p.detach().clone() for _, p in self._params]
        inner_state = copy.deepcopy(self._inner.state_dict())
        self._pseudo = None
        try:
            with torch.no_grad():
                for i, (_, p) in enumerate(self._params):
                    for pending in own_pending:
                        idx, val = pending.tensors[i]
                        estimate = self.compressor.densify(i, idx, val, p.detach())
                        p.sub_(estimate.mul_(self.settings.outer_lr))
            start = [p.detach().clone() for _, p in self._params]
            yield
            with torch.no_grad():
                self._pseudo = [s.sub_(p) for s, (_, p) in zip(start, self._params, strict=True)]
        except BaseException:
            self._inner.load_state_dict(inner_state)
            raise
        finally:
            with torch.no_grad():
                for (_, p), original in zip(self._params, saved, strict=True):
                    p.copy_(original)

    def inner_step(self, lr: float) -> None:
        """One AdamW step on the gradients in `p.grad` (inside `local_round`)."""
        for group in self._inner.param_groups:
            group["lr"] = lr
        self._inner.step()

    # ---- generate ----------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        step: int,
        batch_id: BatchId,
        trainer_nonce: int,
        own_previous: Sequence[OwnResult] = (),
    ) -> Generated:
        """Fold the last round's pseudo-gradient into the error buffer and compress it."""
        if self._pseudo is None:
            raise RuntimeError("generate needs a completed local_round")
        beta = self.settings.compression_decay
        payloads = []
        own: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, error in enumerate(self._error):
            for previous in own_previous:
                idx, val = previous.tensors[i]
                error.sub_(self.compressor.densify(i, idx, val, error))
            if beta != 1.0:
                error.mul_(beta)
            error.add_(self._pseudo[i].to(error.dtype))
            compressed = self.compressor.compress(i, error)
            own.append((compressed.idx, compressed.sent))
            payloads.append(compressed.payload)
        self._pseudo = None
        transmit = DistroResult(
            step, batch_id, trainer_nonce, self.compressor.kind, tuple(payloads)
        )
        return Generated(transmit, OwnResult(tuple(own)))

    # ---- apply -------------------------------------------------------------------------
    @torch.no_grad()
    def apply(self, results: Sequence[DistroResult], lr: float) -> int:
        """`theta -= outer_lr * mean of the results' updates` (any order; sorted here).

        `lr` (the schedule's, which drives the inner steps) is not used: the pseudo-gradients
        already carry it. Returns how many results were applied.
        """
        del lr
        if not results:
            return 0
        ordered = canonical_order(results)
        for result in ordered:
            self.compressor.check(result)
        for i, (_, p) in enumerate(self._params):
            tiles = self.compressor.aggregated(
                i,
                [result.tensors[i] for result in ordered],
                mean_over_all=not self.settings.mean_over_choosers,
                device=p.device,
            )
            update = self.compressor.untile(i, tiles.to(torch.bfloat16))
            p.sub_(update.to(p.dtype).mul_(self.settings.outer_lr))
        return len(ordered)
