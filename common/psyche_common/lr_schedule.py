"""Learning-rate schedules and the cold-start factor (pure Python, no torch).

Owns the four schedules of a run's `[model.LLM.lr_schedule]` table -- Constant, Linear,
Cosine and WarmupStableDecay -- computed in float64 from the coordinator step exactly as the
reference does, and the cold-start factor that re-warms the LR in the first steps of an epoch
that follows a pause:

    lr = lr_at(schedule, step) * cold_start_factor(step, warmup_between)

`schedule` is the pydantic model from `psyche_common.config`; this module only reads field
names, so a plain mapping works too (`{"Cosine": {...}}` or a flat mapping with a `kind` key).

Behaviour kept from the reference on purpose: the cosine progress is *not* clamped, so past
`total_steps` the cosine LR rises again. Degenerate cosine tables (`total_steps <= warmup_steps`,
where the reference divides by zero or underflows) return `final_lr` after the warmup instead
(listed in docs/deviations.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SCHEDULE_KINDS = ("Constant", "Linear", "Cosine", "WarmupStableDecay")


@dataclass(frozen=True)
class ScheduleParams:
    """A schedule normalised to its kind and its numeric fields."""

    kind: str
    fields: Mapping[str, float]

    def get(self, name: str) -> float:
        try:
            return self.fields[name]
        except KeyError:
            raise ValueError(f"lr_schedule.{self.kind} is missing the field {name!r}") from None


_FIELDS: dict[str, tuple[str, ...]] = {
    "Constant": ("base_lr", "warmup_init_lr", "warmup_steps"),
    "Linear": ("base_lr", "warmup_init_lr", "final_lr", "warmup_steps", "total_steps"),
    "Cosine": ("base_lr", "warmup_init_lr", "final_lr", "warmup_steps", "total_steps"),
    "WarmupStableDecay": (
        "base_lr",
        "warmup_init_lr",
        "cosine_decay_final_lr",
        "linear_decay_final_lr",
        "warmup_steps",
        "stable_steps",
        "cosine_decay_steps",
        "linear_decay_steps",
    ),
}


def _read(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _kind_from_class_name(obj: Any) -> str | None:
    class_name = type(obj).__name__
    # Longest names first so "WarmupStableDecay..." is never read as something shorter.
    for kind in sorted(SCHEDULE_KINDS, key=len, reverse=True):
        if class_name.startswith(kind):
            return kind
    return None


def normalize_schedule(schedule: Any) -> ScheduleParams:
    """Find the kind and numeric fields of a schedule given as a config model or a mapping.

    Accepted shapes: an object or mapping with exactly one of the four kind names set
    (`{"Cosine": {...}}`, a pydantic wrapper with optional `Cosine` field, ...); an object whose
    class name starts with the kind (`CosineLR`); or anything with a `kind` field naming it.
    """
    if isinstance(schedule, ScheduleParams):
        return schedule
    if hasattr(schedule, "root") and not isinstance(schedule, Mapping):  # pydantic RootModel
        return normalize_schedule(schedule.root)
    present = [kind for kind in SCHEDULE_KINDS if _read(schedule, kind) is not None]
    if len(present) > 1:
        raise ValueError(f"lr_schedule has more than one schedule set: {', '.join(present)}")
    kind: object
    if present:
        kind, inner = present[0], _read(schedule, present[0])
    else:
        kind = _read(schedule, "kind") or _read(schedule, "type") or _kind_from_class_name(schedule)
        inner = schedule
    if kind not in _FIELDS or not isinstance(kind, str):
        raise ValueError(
            f"lr_schedule is not one of {', '.join(SCHEDULE_KINDS)} (got {type(schedule).__name__})"
        )
    fields: dict[str, float] = {}
    for name in _FIELDS[kind]:
        value = _read(inner, name)
        if value is None:
            raise ValueError(f"lr_schedule.{kind} is missing the field {name!r}")
        fields[name] = value
    params = ScheduleParams(kind=kind, fields=fields)
    check_schedule(params)
    return params


def check_schedule(schedule: Any) -> None:
    """Raise ValueError naming the field at fault if a schedule cannot be evaluated.

    Step counts must be non-negative integers. WarmupStableDecay additionally needs
    `cosine_decay_final_lr <= base_lr` and `linear_decay_final_lr <= cosine_decay_final_lr`
    (the reference asserts both on every call).
    """
    params = schedule if isinstance(schedule, ScheduleParams) else normalize_schedule(schedule)
    for name, value in params.fields.items():
        if name.endswith("_steps"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"lr_schedule.{params.kind}.{name} must be a non-negative integer, got {value!r}"
                )
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"lr_schedule.{params.kind}.{name} must be a number, got {value!r}")
    if params.kind == "WarmupStableDecay":
        base = params.get("base_lr")
        cos_final = params.get("cosine_decay_final_lr")
        lin_final = params.get("linear_decay_final_lr")
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


def _warmup(p: ScheduleParams, step: int) -> float:
    init = float(p.get("warmup_init_lr"))
    base = float(p.get("base_lr"))
    return init + (base - init) * (step / p.get("warmup_steps"))


def _cosine(start_lr: float, final_lr: float, progress: float) -> float:
    return final_lr + (start_lr - final_lr) * (0.5 * (1.0 + math.cos(math.pi * progress)))


def lr_at(schedule: Any, step: int) -> float:
    """The schedule's learning rate at coordinator `step` (steps start at 1; 0 is allowed)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    p = normalize_schedule(schedule)
    warmup_steps = int(p.get("warmup_steps"))
    base = float(p.get("base_lr"))
    if step < warmup_steps:
        return _warmup(p, step)
    if p.kind == "Constant":
        return base
    if p.kind == "Linear":
        total, final = int(p.get("total_steps")), float(p.get("final_lr"))
        if step < total:
            return base + (final - base) * ((step - warmup_steps) / (total - warmup_steps))
        return final
    if p.kind == "Cosine":
        total, final = int(p.get("total_steps")), float(p.get("final_lr"))
        if total <= warmup_steps:
            return final
        # Not clamped: past total_steps the LR climbs back, as in the reference.
        return _cosine(base, final, (step - warmup_steps) / (total - warmup_steps))
    # WarmupStableDecay
    stable_end = warmup_steps + int(p.get("stable_steps"))
    cosine_steps = int(p.get("cosine_decay_steps"))
    cosine_end = stable_end + cosine_steps
    linear_steps = int(p.get("linear_decay_steps"))
    cos_final = float(p.get("cosine_decay_final_lr"))
    lin_final = float(p.get("linear_decay_final_lr"))
    if step < stable_end:
        return base
    if step < cosine_end:
        return _cosine(base, cos_final, (step - stable_end) / cosine_steps)
    if step < cosine_end + linear_steps:
        return cos_final - (cos_final - lin_final) * ((step - cosine_end) / linear_steps)
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


def effective_lr(schedule: Any, step: int, warmup_between: tuple[int, int] | None = None) -> float:
    """`lr_at(schedule, step) * cold_start_factor(step, warmup_between)` (the reference's
    `get_lr(step, warmup_between)`)."""
    return lr_at(schedule, step) * cold_start_factor(step, warmup_between)
