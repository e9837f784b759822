"""Learning-rate schedule variants (`[model.LLM.lr_schedule.<Kind>]`). The maths is elsewhere
(`psyche_common.lr_schedule`); this module only holds the parameters."""

from __future__ import annotations

from typing import Annotated, Literal

from psyche_common.config._types import U32, Float
from psyche_common.config.tagged import Variant, toml_tagged


class ConstantLR(Variant):
    """Linear warmup from warmup_init_lr to base_lr, then base_lr."""

    kind: Literal["Constant"] = "Constant"
    base_lr: Float
    warmup_steps: U32
    warmup_init_lr: Float


class LinearLR(Variant):
    """Warmup, then linear from base_lr to final_lr at total_steps, then final_lr."""

    kind: Literal["Linear"] = "Linear"
    base_lr: Float
    warmup_steps: U32
    warmup_init_lr: Float
    total_steps: U32
    final_lr: Float


class CosineLR(Variant):
    """Warmup, then cosine from base_lr to final_lr at total_steps."""

    kind: Literal["Cosine"] = "Cosine"
    base_lr: Float
    warmup_steps: U32
    warmup_init_lr: Float
    total_steps: U32
    final_lr: Float


class WarmupStableDecayLR(Variant):
    """Warmup, stable base_lr, cosine decay, then linear decay, then constant."""

    kind: Literal["WarmupStableDecay"] = "WarmupStableDecay"
    base_lr: Float
    warmup_steps: U32
    warmup_init_lr: Float
    stable_steps: U32
    cosine_decay_steps: U32
    cosine_decay_final_lr: Float
    linear_decay_steps: U32
    linear_decay_final_lr: Float


LR_SCHEDULE_VARIANTS = (ConstantLR, LinearLR, CosineLR, WarmupStableDecayLR)

AnyLRSchedule = ConstantLR | LinearLR | CosineLR | WarmupStableDecayLR

LRSchedule = Annotated[AnyLRSchedule, *toml_tagged("lr schedule", *LR_SCHEDULE_VARIANTS)]
"""`AnyLRSchedule` read from and written to its TOML form (use it as a pydantic field type)."""
