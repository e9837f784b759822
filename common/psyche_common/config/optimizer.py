"""Optimizer variants (`model.LLM.optimizer`): `"Dummy"`, `[....optimizer.AdamW]`,
`[....optimizer.Distro]` or `[....optimizer.SparseLoCo]` (ours, not the reference's). Optional
fields (`clip_grad_norm`, Distro's `weight_decay` and `quantize_2bit`, SparseLoCo's
`quantize_codebook`, `quantize_4bit`, `mean_over_choosers`, `clip_to_median` and `dct`) may be
left out; left out, `quantize_2bit`, `quantize_codebook`, `quantize_4bit`,
`mean_over_choosers` and `clip_to_median` are false, `dct` is true and a Distro table means
what it means to the reference."""

from __future__ import annotations

from typing import Annotated, Literal

from psyche_common.config._types import U16, Bool, Float
from psyche_common.config.tagged import Variant, toml_tagged


class DummyOptimizer(Variant):
    """No optimizer step (test runs only)."""

    kind: Literal["Dummy"] = "Dummy"

    def __str__(self) -> str:
        return "Dummy"


class AdamWOptimizer(Variant):
    """Plain AdamW on every client (no compression)."""

    kind: Literal["AdamW"] = "AdamW"
    betas: tuple[Float, Float]
    """AdamW's two moment decays [b1, b2]."""
    weight_decay: Float
    """AdamW's decoupled weight decay."""
    eps: Float
    """AdamW's epsilon, added to the second moment's root."""
    clip_grad_norm: Float | None = None
    """Clip the gradient to this global norm before the step; left out: no clipping."""

    def __str__(self) -> str:
        return f"AdamW (betas {self.betas[0]}/{self.betas[1]}, weight decay {self.weight_decay})"


class DistroOptimizer(Variant):
    """DisTrO: DCT-compressed, top-k sparsified momentum shared between clients."""

    kind: Literal["Distro"] = "Distro"
    clip_grad_norm: Float | None = None
    weight_decay: Float | None = None
    compression_decay: Float
    compression_topk: U16
    compression_chunk: U16
    quantize_1bit: Bool
    quantize_2bit: Bool | None = None  # ours: 2-bit values with a bf16 scale per chunk

    def __str__(self) -> str:
        bits = ", 1-bit" if self.quantize_1bit else ", 2-bit" if self.quantize_2bit else ""
        return (
            f"DisTrO (chunk {self.compression_chunk}, top-k {self.compression_topk}, "
            f"decay {self.compression_decay}{bits})"
        )


class SparseLocoOptimizer(Variant):
    """SparseLoCo (ours): `inner_steps` local AdamW steps per round on equal parts of the
    client's batch; the pseudo-gradient goes through DisTrO's DCT + top-k compression with
    error feedback (decay `compression_decay`) and `theta -= outer_lr * mean` on apply."""

    kind: Literal["SparseLoCo"] = "SparseLoCo"
    inner_steps: U16
    outer_lr: Float
    compression_decay: Float
    compression_topk: U16
    compression_chunk: U16
    quantize_2bit: Bool
    quantize_codebook: Bool | None = None  # left out: false (2-bit levels s/3, s of the max)
    quantize_4bit: Bool | None = None  # left out: false
    betas: tuple[Float, Float]
    weight_decay: Float
    eps: Float
    clip_grad_norm: Float | None = None
    mean_over_choosers: Bool | None = None  # left out: false (mean over all results)
    clip_to_median: Bool | None = None  # left out: false (normalise to the median RMS)
    dct: Bool | None = None  # left out: true (top-k of each tile's DCT coefficients)

    def __str__(self) -> str:
        values = (
            "4-bit"
            if self.quantize_4bit
            else "2-bit codebook"
            if self.quantize_2bit and self.quantize_codebook
            else "2-bit"
            if self.quantize_2bit
            else "bf16"
        )
        mean = ", mean over choosers" if self.mean_over_choosers else ""
        clip = ", clipped to the median" if self.clip_to_median else ""
        dct = ", no DCT" if self.dct is False else ""
        return (
            f"SparseLoCo ({self.inner_steps} AdamW steps per round, outer lr {self.outer_lr}, "
            f"chunk {self.compression_chunk}, top-k {self.compression_topk}, "
            f"decay {self.compression_decay}, {values}{mean}{clip}{dct})"
        )


OPTIMIZER_VARIANTS = (DummyOptimizer, AdamWOptimizer, DistroOptimizer, SparseLocoOptimizer)

AnyOptimizer = DummyOptimizer | AdamWOptimizer | DistroOptimizer | SparseLocoOptimizer

Optimizer = Annotated[AnyOptimizer, *toml_tagged("optimizer", *OPTIMIZER_VARIANTS)]
"""`AnyOptimizer` read from and written to its TOML form (use it as a pydantic field type)."""
