"""LR schedules and the cold-start factor: the reference's test values (client spec section 1.8)."""

from __future__ import annotations

import math

import pytest
from psyche_common.config import (
    AnyLRSchedule,
    ConstantLR,
    CosineLR,
    LinearLR,
    LRSchedule,
    WarmupStableDecayLR,
)
from psyche_common.lr_schedule import (
    check_schedule,
    cold_start_bounds,
    cold_start_factor,
    effective_lr,
    lr_at,
)
from pydantic import TypeAdapter


def constant(base: float, warmup: int, init: float) -> ConstantLR:
    return ConstantLR(base_lr=base, warmup_steps=warmup, warmup_init_lr=init)


def linear(base: float, warmup: int, init: float, total: int, final: float) -> LinearLR:
    return LinearLR(
        base_lr=base, warmup_steps=warmup, warmup_init_lr=init, total_steps=total, final_lr=final
    )


def cosine(base: float, warmup: int, init: float, total: int, final: float) -> CosineLR:
    return CosineLR(
        base_lr=base, warmup_steps=warmup, warmup_init_lr=init, total_steps=total, final_lr=final
    )


def wsd(
    base: float,
    warmup: int,
    init: float,
    stable: int,
    cos_steps: int,
    cos_final: float,
    lin_steps: int,
    lin_final: float,
) -> WarmupStableDecayLR:
    return WarmupStableDecayLR(
        base_lr=base,
        warmup_steps=warmup,
        warmup_init_lr=init,
        stable_steps=stable,
        cosine_decay_steps=cos_steps,
        cosine_decay_final_lr=cos_final,
        linear_decay_steps=lin_steps,
        linear_decay_final_lr=lin_final,
    )


def from_toml(table: object) -> AnyLRSchedule:
    """A schedule read from its TOML form, as the config loader reads it."""
    return TypeAdapter(LRSchedule).validate_python(table)


def close(a: float, b: float, abs_tol: float = 1e-12) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=abs_tol)


def test_constant_schedule() -> None:
    s = constant(0.01, 10, 0.001)
    assert close(lr_at(s, 0), 0.001)
    assert close(lr_at(s, 5), 0.001 + (0.01 - 0.001) * 0.5)
    assert close(lr_at(s, 9), 0.001 + (0.01 - 0.001) * 0.9)
    for step in (10, 100, 1000):
        assert close(lr_at(s, step), 0.01)


def test_linear_schedule() -> None:
    s = linear(0.01, 10, 0.001, 100, 0.0001)
    assert close(lr_at(s, 0), 0.001)
    assert close(lr_at(s, 5), 0.0055)
    assert close(lr_at(s, 10), 0.01)
    assert close(lr_at(s, 55), 0.01 + (0.0001 - 0.01) * 0.5)
    assert close(lr_at(s, 100), 0.0001)
    assert close(lr_at(s, 200), 0.0001)


def test_cosine_schedule_reference_values() -> None:
    s = cosine(0.01, 10, 0.001, 110, 0.0)
    assert close(lr_at(s, 0), 0.001)
    assert close(lr_at(s, 5), 0.0055)
    assert close(lr_at(s, 10), 0.01)
    assert close(lr_at(s, 60), 0.005)
    assert close(lr_at(s, 110), 0.0, abs_tol=1e-15)
    # Steps start at 1: lr(1) = init + (base - init) / W.
    assert close(lr_at(s, 1), 0.001 + 0.009 / 10)


def test_cosine_is_not_clamped_past_total_steps() -> None:
    s = cosine(0.01, 10, 0.001, 110, 0.0)
    assert lr_at(s, 160) > lr_at(s, 110)
    assert close(lr_at(s, 210), 0.01)


def test_cosine_degenerate_total_returns_final() -> None:
    s = cosine(0.01, 10, 0.001, 10, 0.002)
    assert close(lr_at(s, 5), 0.0055)
    assert close(lr_at(s, 10), 0.002)
    assert close(lr_at(s, 50), 0.002)


def test_warmup_stable_decay_schedule() -> None:
    s = wsd(0.01, 10, 0.001, 60, 110, 0.001, 20, 0.0)
    assert close(lr_at(s, 0), 0.001)
    assert close(lr_at(s, 5), 0.0055)
    for step in (10, 30, 69, 70):
        assert close(lr_at(s, step), 0.01)
    assert math.isclose(lr_at(s, 125), 0.0055, abs_tol=1e-4)
    assert math.isclose(lr_at(s, 179), 0.001, abs_tol=1e-4)
    assert close(lr_at(s, 180), 0.001)
    assert close(lr_at(s, 190), 0.0005)
    assert math.isclose(lr_at(s, 199), 0.0001, abs_tol=1e-4)
    assert close(lr_at(s, 200), 0.0)
    assert close(lr_at(s, 250), 0.0)


def test_edge_cases_from_reference() -> None:
    assert close(lr_at(constant(0.01, 0, 0.001), 0), 0.01)
    assert close(lr_at(linear(0.01, 10, 0.01, 100, 0.001), 5), 0.01)
    assert close(lr_at(cosine(0.01, 10, 0.001, 100, 0.01), 50), 0.01)
    assert close(lr_at(wsd(0.01, 0, 0.001, 0, 0, 0.001, 0, 0.001), 0), 0.001)


def test_wsd_ordering_is_checked() -> None:
    with pytest.raises(ValueError, match="cosine_decay_final_lr"):
        check_schedule(wsd(0.01, 0, 0.0, 0, 10, 0.02, 0, 0.0))
    with pytest.raises(ValueError, match="linear_decay_final_lr"):
        lr_at(wsd(0.01, 0, 0.0, 0, 10, 0.001, 10, 0.002), 3)


def test_the_toml_form_reads_into_the_same_schedule() -> None:
    table = {
        "Cosine": {
            "base_lr": 0.01,
            "warmup_init_lr": 0.001,
            "final_lr": 0.0,
            "warmup_steps": 10,
            "total_steps": 110,
        }
    }
    model = from_toml(table)
    assert model == cosine(0.01, 10, 0.001, 110, 0.0)
    assert close(lr_at(model, 60), 0.005)


def test_bad_schedules_name_the_field() -> None:
    # a schedule is a config model: a bad table fails where it is read, naming the field
    with pytest.raises(ValueError, match="final_lr"):
        from_toml({"Cosine": {"base_lr": 1.0, "warmup_init_lr": 0.0, "warmup_steps": 1}})
    with pytest.raises(ValueError, match="warmup_steps"):
        constant(0.01, -1, 0.0)
    with pytest.raises(ValueError, match="unknown lr schedule 'Exponential'"):
        from_toml({"Exponential": {}})
    with pytest.raises(ValueError, match="exactly one key"):
        from_toml({**constant(0.1, 0, 0.0).to_toml(), **cosine(0.1, 0, 0.0, 10, 0.0).to_toml()})
    with pytest.raises(ValueError, match="step"):
        lr_at(constant(0.01, 0, 0.0), -1)


def test_cold_start_factor() -> None:
    assert cold_start_bounds(40, cold_start_epoch=False, cold_start_warmup_steps=5) is None
    assert cold_start_bounds(40, cold_start_epoch=True, cold_start_warmup_steps=0) is None
    bounds = cold_start_bounds(40, cold_start_epoch=True, cold_start_warmup_steps=4)
    assert bounds == (40, 44)
    assert cold_start_factor(40, bounds) == 0.0
    assert cold_start_factor(41, bounds) == 0.25
    assert cold_start_factor(44, bounds) == 1.0
    assert cold_start_factor(45, bounds) == 1.0
    assert cold_start_factor(39, bounds) == 1.0
    assert cold_start_factor(40, None) == 1.0


def test_effective_lr_combines_schedule_and_cold_start() -> None:
    s = constant(0.01, 0, 0.0)
    assert effective_lr(s, 42, (40, 44)) == pytest.approx(0.005)
    assert effective_lr(s, 42) == pytest.approx(0.01)


def test_config_models_from_psyche_common_config() -> None:
    model = CosineLR(
        base_lr=0.01, warmup_steps=10, warmup_init_lr=0.001, total_steps=110, final_lr=0.0
    )
    assert close(lr_at(model, 60), 0.005)
    w = WarmupStableDecayLR(
        base_lr=0.01,
        warmup_steps=10,
        warmup_init_lr=0.001,
        stable_steps=60,
        cosine_decay_steps=110,
        cosine_decay_final_lr=0.001,
        linear_decay_steps=20,
        linear_decay_final_lr=0.0,
    )
    assert close(lr_at(w, 190), 0.0005)
