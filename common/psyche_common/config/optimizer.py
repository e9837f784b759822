"""Optimizer variants (`model.LLM.optimizer`): `"Dummy"`, `[....optimizer.AdamW]` or
`[....optimizer.Distro]`. Optional fields (`clip_grad_norm`, Distro's `weight_decay`) may be left out."""

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
    weight_decay: Float
    eps: Float
    clip_grad_norm: Float | None = None

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

    def __str__(self) -> str:
        one_bit = ", 1-bit" if self.quantize_1bit else ""
        return (
            f"DisTrO (chunk {self.compression_chunk}, top-k {self.compression_topk}, "
            f"decay {self.compression_decay}{one_bit})"
        )


OPTIMIZER_VARIANTS = (DummyOptimizer, AdamWOptimizer, DistroOptimizer)

AnyOptimizer = DummyOptimizer | AdamWOptimizer | DistroOptimizer

Optimizer = Annotated[AnyOptimizer, *toml_tagged("optimizer", *OPTIMIZER_VARIANTS)]
"""`AnyOptimizer` read from and written to its TOML form (use it as a pydantic field type)."""
