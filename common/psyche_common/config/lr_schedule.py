"""Learning-rate schedule variants (`[model.LLM.lr_schedule.<Kind>]`). The maths is elsewhere
(`psyche_common.lr_schedule`); this module only holds the parameters."""

from __future__ import annotations

from typing import Annotated, Literal

from psyche_common.config._types import U32, Float
from psyche_common.config.tagged import Variant, toml_tagged


class _Warmup(Variant):
    """The fields every schedule starts with: the linear warmup to `base_lr`."""

    base_lr: Float
    """The learning rate at the end of the warmup. Not negative."""
    warmup_steps: U32
    """Steps of the linear warmup from `warmup_init_lr` to `base_lr` (0: none)."""
    warmup_init_lr: Float
    """The learning rate at step 0 of the warmup. Not negative."""


class _Decay(_Warmup):
    """A warmup, then a decay from `base_lr` to `final_lr` at `total_steps`."""

    total_steps: U32
    """The step at which the decay reaches `final_lr`."""
    final_lr: Float
    """The learning rate at `total_steps`. Not negative."""


class ConstantLR(_Warmup):
    """Linear warmup from warmup_init_lr to base_lr, then base_lr."""

    kind: Literal["Constant"] = "Constant"


class LinearLR(_Decay):
    """Warmup, then linear from base_lr to final_lr at total_steps, then final_lr."""

    kind: Literal["Linear"] = "Linear"


class CosineLR(_Decay):
    """Warmup, then cosine from base_lr to final_lr at total_steps (not clamped after it)."""

    kind: Literal["Cosine"] = "Cosine"


class WarmupStableDecayLR(_Warmup):
    """Warmup, stable base_lr, cosine decay, then linear decay, then constant."""

    kind: Literal["WarmupStableDecay"] = "WarmupStableDecay"
    stable_steps: U32
    """Steps at `base_lr` after the warmup."""
    cosine_decay_steps: U32
    """Steps of the cosine decay from `base_lr` to `cosine_decay_final_lr`."""
    cosine_decay_final_lr: Float
    """The learning rate at the end of the cosine decay; at most `base_lr`."""
    linear_decay_steps: U32
    """Steps of the linear decay from `cosine_decay_final_lr` to `linear_decay_final_lr`."""
    linear_decay_final_lr: Float
    """The learning rate from the end of the linear decay on; at most
    `cosine_decay_final_lr`."""


LR_SCHEDULE_VARIANTS = (ConstantLR, LinearLR, CosineLR, WarmupStableDecayLR)

AnyLRSchedule = ConstantLR | LinearLR | CosineLR | WarmupStableDecayLR

LRSchedule = Annotated[AnyLRSchedule, *toml_tagged("lr schedule", *LR_SCHEDULE_VARIANTS)]
"""`AnyLRSchedule` read from and written to its TOML form (use it as a pydantic field type)."""
