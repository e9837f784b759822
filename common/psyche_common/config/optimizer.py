"""Optimizer variants (`model.LLM.optimizer`): `"Dummy"`, `[....optimizer.AdamW]`,
`[....optimizer.Distro]` or `[....optimizer.SparseLoCo]` (ours, not the reference's). Optional
fields (`clip_grad_norm`, Distro's `weight_decay`, SparseLoCo's `mean_over_choosers`,
`clip_to_median` and `dct`) may be left out; left out, `mean_over_choosers` and
`clip_to_median` are false and `dct` is true.

How values travel is one field, `value_format` (ours; `value_format.VALUE_FORMATS`). A table
may spell it with the older booleans instead (Distro: the reference's `quantize_1bit`, and
`quantize_2bit`; SparseLoCo: `quantize_2bit`, `quantize_codebook`, `quantize_4bit`; left out,
each is false), so a reference Distro table means what it means to the reference;
`resolved_value_format()` reads either (`value_format.resolve_value_format`). A table needs
`value_format` or its main boolean (Distro's `quantize_1bit`, SparseLoCo's `quantize_2bit`)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import model_validator

from psyche_common.config._types import U16, Bool, Float
from psyche_common.config.tagged import Variant, toml_tagged
from psyche_common.config.value_format import (
    Clash,
    Spellings,
    ValueFormat,
    ValueFormatConflict,
    resolve_value_format,
)

_BASE = "model.LLM.optimizer"

DISTRO_SPELLINGS: Spellings = {
    "bf16": {"quantize_1bit": False, "quantize_2bit": False},
    "1-bit": {"quantize_1bit": True, "quantize_2bit": False},
    "2-bit": {"quantize_1bit": False, "quantize_2bit": True},
}
"""The value formats a Distro table sends, and the booleans that spell each."""
DISTRO_CLASHES = (
    Clash("quantize_2bit", "quantize_1bit", True, "values are sent as 1 bit, 2 bits or bf16"),
)

SPARSELOCO_SPELLINGS: Spellings = {
    "bf16": {"quantize_2bit": False, "quantize_codebook": False, "quantize_4bit": False},
    "2-bit": {"quantize_2bit": True, "quantize_codebook": False, "quantize_4bit": False},
    "2-bit codebook": {"quantize_2bit": True, "quantize_codebook": True, "quantize_4bit": False},
    "4-bit": {"quantize_2bit": False, "quantize_codebook": False, "quantize_4bit": True},
}
"""The value formats a SparseLoCo table sends (its values must carry magnitudes: no 1-bit),
and the booleans that spell each."""
SPARSELOCO_CLASHES = (
    Clash("quantize_4bit", "quantize_2bit", True, "values are sent as 2 bits, 4 bits or bf16"),
    Clash("quantize_codebook", "quantize_2bit", False, "it places the four 2-bit levels"),
)


def _require(table: str, value_format: ValueFormat | None, main: str, value: bool | None) -> None:
    if value_format is None and value is None:
        raise ValueError(f"{_BASE}.{table} needs value_format (or the older {main})")


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
    quantize_1bit: Bool | None = None  # the reference's (required there): sign-only values
    quantize_2bit: Bool | None = None  # ours: 2-bit values with a bf16 scale per chunk
    value_format: Literal["bf16", "1-bit", "2-bit"] | None = None  # ours: replaces both

    @model_validator(mode="after")
    def _named_format(self) -> Self:
        _require("Distro", self.value_format, "quantize_1bit", self.quantize_1bit)
        return self

    def resolved_value_format(self) -> ValueFormat:
        """The value format this table names (`value_format`, else the booleans); raises
        `ValueFormatConflict` naming the field at fault."""
        given = {"quantize_1bit": self.quantize_1bit, "quantize_2bit": self.quantize_2bit}
        return resolve_value_format(
            f"{_BASE}.Distro", self.value_format, given, DISTRO_SPELLINGS, DISTRO_CLASHES
        )

    def __str__(self) -> str:
        named = _shown(self)
        bits = "" if named == "bf16" else f", {named}"
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
    quantize_2bit: Bool | None = None  # the older spelling of value_format (with the two below)
    quantize_codebook: Bool | None = None  # left out: false (2-bit levels s/3, s of the max)
    quantize_4bit: Bool | None = None  # left out: false
    value_format: Literal["bf16", "2-bit", "2-bit codebook", "4-bit"] | None = None
    betas: tuple[Float, Float]
    weight_decay: Float
    eps: Float
    clip_grad_norm: Float | None = None
    mean_over_choosers: Bool | None = None  # left out: false (mean over all results)
    clip_to_median: Bool | None = None  # left out: false (normalise to the median RMS)
    dct: Bool | None = None  # left out: true (top-k of each tile's DCT coefficients)

    @model_validator(mode="after")
    def _named_format(self) -> Self:
        _require("SparseLoCo", self.value_format, "quantize_2bit", self.quantize_2bit)
        return self

    def resolved_value_format(self) -> ValueFormat:
        """The value format this table names (`value_format`, else the booleans); raises
        `ValueFormatConflict` naming the field at fault."""
        given = {
            "quantize_2bit": self.quantize_2bit,
            "quantize_codebook": self.quantize_codebook,
            "quantize_4bit": self.quantize_4bit,
        }
        return resolve_value_format(
            f"{_BASE}.SparseLoCo",
            self.value_format,
            given,
            SPARSELOCO_SPELLINGS,
            SPARSELOCO_CLASHES,
        )

    def __str__(self) -> str:
        values = _shown(self)
        mean = ", mean over choosers" if self.mean_over_choosers else ""
        clip = ", clipped to the median" if self.clip_to_median else ""
        dct = ", no DCT" if self.dct is False else ""
        return (
            f"SparseLoCo ({self.inner_steps} AdamW steps per round, outer lr {self.outer_lr}, "
            f"chunk {self.compression_chunk}, top-k {self.compression_topk}, "
            f"decay {self.compression_decay}, {values}{mean}{clip}{dct})"
        )


def _shown(optimizer: DistroOptimizer | SparseLocoOptimizer) -> str:
    """The value format for a summary line (the conflict, when the fields disagree)."""
    try:
        return optimizer.resolved_value_format()
    except ValueFormatConflict:
        return "value format in conflict"


OPTIMIZER_VARIANTS = (DummyOptimizer, AdamWOptimizer, DistroOptimizer, SparseLocoOptimizer)

AnyOptimizer = DummyOptimizer | AdamWOptimizer | DistroOptimizer | SparseLocoOptimizer

Optimizer = Annotated[AnyOptimizer, *toml_tagged("optimizer", *OPTIMIZER_VARIANTS)]
"""`AnyOptimizer` read from and written to its TOML form (use it as a pydantic field type)."""
