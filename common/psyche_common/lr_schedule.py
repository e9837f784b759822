"""Learning-rate schedules and the cold-start factor (pure Python, no torch).

Owns the maths of the four schedules of a run's `[model.LLM.lr_schedule]` table -- Constant,
Linear, Cosine and WarmupStableDecay, the variants of `psyche_common.config.AnyLRSchedule` --
computed in float64 from the coordinator step exactly as the reference does, and the
cold-start factor that re-warms the LR in the first steps of an epoch that follows a pause:

    lr = lr_at(schedule, step) * cold_start_factor(step, warmup_between)

Behaviour kept from the reference on purpose: the cosine progress is *not* clamped, so past
`total_steps` the cosine LR rises again. Degenerate cosine tables (`total_steps <= warmup_steps`,
where the reference divides by zero or underflows) return `final_lr` after the warmup instead
(listed in docs/deviations.md).
"""

from __future__ import annotations

import math

from psyche_common.config.lr_schedule import (
    AnyLRSchedule,
    ConstantLR,
    CosineLR,
    LinearLR,
    WarmupStableDecayLR,
)


def check_schedule(schedule: AnyLRSchedule) -> None:
    """Raise ValueError naming the field at fault if a schedule cannot be evaluated.

    The config models already hold non-negative integer step counts and numbers;
    WarmupStableDecay additionally needs `cosine_decay_final_lr <= base_lr` and
    `linear_decay_final_lr <= cosine_decay_final_lr` (the reference asserts both on every call).
    """
    if not isinstance(schedule, WarmupStableDecayLR):
        return
    base = schedule.base_lr
    cos_final = schedule.cosine_decay_final_lr
    lin_final = schedule.linear_decay_final_lr
    if cos_final > base:
        raise ValueError(
            "lr_schedule.WarmupStableDecay.cosine_decay_final_lr "
            f"({cos_final}) must be <= base_lr ({base})"
        )
    if lin_final > cos_final:
        raise ValueError(
            "lr_schedule.WarmupStableDecay.linear_decay_final_lr "
            f"({lin_final}) must be <= cosine_decay_final_lr ({cos_final})"
        )


def _cosine(start_lr: float, final_lr: float, progress: float) -> float:
    return final_lr + (start_lr - final_lr) * (0.5 * (1.0 + math.cos(math.pi * progress)))


def lr_at(schedule: AnyLRSchedule, step: int) -> float:
    """The schedule's learning rate at coordinator `step` (steps start at 1; 0 is allowed)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    check_schedule(schedule)
    warmup_steps = schedule.warmup_steps
    base = float(schedule.base_lr)
    if step < warmup_steps:
        init = float(schedule.warmup_init_lr)
        return init + (base - init) * (step / warmup_steps)
    match schedule:
        case ConstantLR():
            return base
        case LinearLR(total_steps=total, final_lr=final):
            if step < total:
                return base + (final - base) * ((step - warmup_steps) / (total - warmup_steps))
            return float(final)
        case CosineLR(total_steps=total, final_lr=final):
            if total <= warmup_steps:
                return float(final)
            # Not clamped: past total_steps the LR climbs back, as in the reference.
            return _cosine(base, final, (step - warmup_steps) / (total - warmup_steps))
        case WarmupStableDecayLR():
            return _warmup_stable_decay(schedule, step)


def _warmup_stable_decay(schedule: WarmupStableDecayLR, step: int) -> float:
    """After the warmup: stable `base_lr`, a cosine decay, a linear decay, then constant."""
    base = float(schedule.base_lr)
    stable_end = schedule.warmup_steps + schedule.stable_steps
    cosine_end = stable_end + schedule.cosine_decay_steps
    cos_final = float(schedule.cosine_decay_final_lr)
    lin_final = float(schedule.linear_decay_final_lr)
    if step < stable_end:
        return base
    if step < cosine_end:
        return _cosine(base, cos_final, (step - stable_end) / schedule.cosine_decay_steps)
    if step < cosine_end + schedule.linear_decay_steps:
        progress = (step - cosine_end) / schedule.linear_decay_steps
        return cos_final - (cos_final - lin_final) * progress
    return lin_final


def cold_start_bounds(
    epoch_start_step: int, cold_start_epoch: bool, cold_start_warmup_steps: int
) -> tuple[int, int] | None:
    """`warmup_between` for an epoch: `(start, start + cold_start_warmup_steps)` only when the
    epoch follows a pause (`cold_start_epoch`) and the config asks for a re-warm; else None."""
    if cold_start_epoch and cold_start_warmup_steps > 0:
        return (epoch_start_step, epoch_start_step + cold_start_warmup_steps)
    return None


def cold_start_factor(step: int, warmup_between: tuple[int, int] | None) -> float:
    """The LR multiplier after a pause: `(step - start) / (end - start)` for
    `start <= step <= end`, 1 otherwise. The first step of a cold epoch therefore uses LR 0."""
    if warmup_between is None:
        return 1.0
    start, end = warmup_between
    if end <= start:
        return 1.0
    if start <= step <= end:
        return (step - start) / (end - start)
    return 1.0


def effective_lr(
    schedule: AnyLRSchedule, step: int, warmup_between: tuple[int, int] | None = None
) -> float:
    """`lr_at(schedule, step) * cold_start_factor(step, warmup_between)` (the reference's
    `get_lr(step, warmup_between)`)."""
    return lr_at(schedule, step) * cold_start_factor(step, warmup_between)
