"""Optimizer tables: DisTrO's optional `quantize_2bit`, the SparseLoCo table and its rules,
and the reference's fixtures meaning what they meant."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from psyche_client.distro.sparseloco import SparseLocoSettings
from psyche_client.training.trainer import optimizer_settings
from psyche_common.config import (
    ConfigError,
    DistroOptimizer,
    SparseLocoOptimizer,
    StateFile,
    load_state,
    parse_state,
    validate_state,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

SPARSELOCO: dict[str, Any] = {
    "inner_steps": 5,
    "outer_lr": 1.0,
    "compression_decay": 0.95,
    "compression_topk": 32,
    "compression_chunk": 64,
    "quantize_2bit": True,
    "betas": [0.9, 0.95],
    "weight_decay": 0.1,
    "eps": 1e-8,
    "clip_grad_norm": 1.0,
}


def state_with(optimizer: Any) -> StateFile:
    document = tomllib.loads((REPO_ROOT / "state.toml.example").read_text())
    document["model"]["LLM"]["optimizer"] = optimizer
    return parse_state(document)


def problems(state: StateFile) -> tuple[list[str], list[str]]:
    report = validate_state(state)
    return [p.field for p in report.errors], [p.field for p in report.warnings]


def test_sparseloco_table_loads_validates_and_round_trips() -> None:
    state = state_with({"SparseLoCo": dict(SPARSELOCO)})
    optimizer = state.model.optimizer
    assert isinstance(optimizer, SparseLocoOptimizer)
    assert optimizer.inner_steps == 5 and optimizer.betas == (0.9, 0.95)
    assert validate_state(state).ok
    assert "SparseLoCo (5 AdamW steps per round" in str(optimizer)
    again = parse_state(tomllib.loads(tomli_w.dumps(state.to_toml_dict())))
    assert again == state


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("inner_steps", 0, "inner_steps must be at least 1"),
        ("outer_lr", 0.0, "outer_lr (0.0) must be greater than 0"),
        ("compression_decay", 1.5, "compression_decay (1.5) must be between 0 and 1"),
        ("compression_topk", 0, "compression_topk must be at least 1"),
        ("compression_chunk", 0, "compression_chunk must be at least 1"),
        ("betas", [0.9, 1.0], "betas [0.9, 1.0] must both be at least 0 and below 1"),
        ("eps", 0.0, "eps (0.0) must be greater than 0"),
        ("weight_decay", -0.1, "weight_decay (-0.1) must not be negative"),
        ("clip_grad_norm", -1.0, "clip_grad_norm (-1.0) must not be negative"),
    ],
)
def test_sparseloco_rules_name_the_field(field: str, value: Any, words: str) -> None:
    table = dict(SPARSELOCO)
    table[field] = value
    report = validate_state(state_with({"SparseLoCo": table}))
    assert [p.field for p in report.errors] == [f"model.LLM.optimizer.SparseLoCo.{field}"]
    assert words in report.errors[0].message


def test_sparseloco_fields_are_typed_and_required() -> None:
    table = dict(SPARSELOCO)
    table["inner_steps"] = "5"
    with pytest.raises(ConfigError, match=r"model\.LLM\.optimizer\.SparseLoCo\.inner_steps"):
        state_with({"SparseLoCo": table})
    table = dict(SPARSELOCO)
    del table["outer_lr"]
    with pytest.raises(ConfigError, match=r"model\.LLM\.optimizer\.SparseLoCo\.outer_lr"):
        state_with({"SparseLoCo": table})
    table = dict(SPARSELOCO, outer_lr_schedule="cosine")
    with pytest.raises(ConfigError, match="outer_lr_schedule"):
        state_with({"SparseLoCo": table})


def test_more_inner_steps_than_samples_is_a_warning() -> None:
    table = dict(SPARSELOCO, inner_steps=9)  # the example's global batch is 8
    errors, warnings = problems(state_with({"SparseLoCo": table}))
    assert errors == []
    assert warnings == ["model.LLM.optimizer.SparseLoCo.inner_steps"]


def test_distro_quantize_2bit_is_optional_and_exclusive_with_1bit() -> None:
    distro = tomllib.loads((REPO_ROOT / "state.toml.example").read_text())["model"]["LLM"][
        "optimizer"
    ]["Distro"]
    plain = state_with({"Distro": dict(distro)})
    assert plain.model.optimizer.quantize_2bit is None
    assert "quantize_2bit" not in plain.model.optimizer.to_toml()["Distro"]
    two_bit = state_with({"Distro": dict(distro, quantize_1bit=False, quantize_2bit=True)})
    assert validate_state(two_bit).ok
    assert "2-bit" in str(two_bit.model.optimizer)
    both = state_with({"Distro": dict(distro, quantize_2bit=True)})
    errors, _ = problems(both)
    assert errors == ["model.LLM.optimizer.Distro.quantize_2bit"]


def test_reference_distro_tables_keep_their_meaning(shared_fixtures: Path) -> None:
    """No fixture names quantize_2bit, so each reads and writes back exactly as before."""
    seen = 0
    for path in sorted((shared_fixtures / "configs").glob("*/state.toml")):
        raw = tomllib.loads(path.read_text())["model"]["LLM"]["optimizer"]
        optimizer = load_state(path).model.optimizer
        if isinstance(optimizer, DistroOptimizer):
            seen += 1
            assert optimizer.quantize_2bit is None
            assert optimizer.to_toml() == raw, path
    assert seen >= 1


def test_sparseloco_example_builds_the_trainer_settings() -> None:
    state = load_state(REPO_ROOT / "state.sparseloco.toml.example")
    settings = optimizer_settings(state.model.optimizer)
    assert isinstance(settings, SparseLocoSettings)
    assert (settings.inner_steps, settings.compression_topk, settings.compression_decay) == (
        5,
        32,
        0.9,
    )
    # the best setting at >= 600x of the optimizer study (docs/distro.md)
    assert settings.value_kind.name == "TWO_BIT_CODEBOOK"
    assert (settings.mean_over_choosers, settings.clip_to_median, settings.dct) == (
        True,
        True,
        False,
    )
    assert validate_state(state).ok and validate_state(state).warnings == []


@pytest.mark.parametrize(
    ("field", "words"),
    [("mean_over_choosers", "mean over choosers"), ("clip_to_median", "clipped to the median")],
)
def test_sparseloco_templar_options_are_optional_and_reach_the_trainer(
    field: str, words: str
) -> None:
    plain = state_with({"SparseLoCo": dict(SPARSELOCO)})
    assert isinstance(plain.model.optimizer, SparseLocoOptimizer)
    assert getattr(plain.model.optimizer, field) is None
    assert field not in plain.model.optimizer.to_toml()
    assert getattr(optimizer_settings(plain.model.optimizer), field) is False
    chosen = state_with({"SparseLoCo": {**SPARSELOCO, field: True}})
    assert validate_state(chosen).ok
    assert words in str(chosen.model.optimizer)
    assert getattr(optimizer_settings(chosen.model.optimizer), field) is True
    assert parse_state(tomllib.loads(tomli_w.dumps(chosen.to_toml_dict()))) == chosen
    with pytest.raises(ConfigError, match=rf"SparseLoCo\.{field}"):
        state_with({"SparseLoCo": {**SPARSELOCO, field: "yes"}})


def test_sparseloco_dct_is_optional_and_on_unless_false() -> None:
    plain = state_with({"SparseLoCo": dict(SPARSELOCO)})
    assert isinstance(plain.model.optimizer, SparseLocoOptimizer)
    assert plain.model.optimizer.dct is None and "dct" not in plain.model.optimizer.to_toml()
    assert optimizer_settings(plain.model.optimizer).dct is True  # type: ignore[union-attr]
    raw = state_with({"SparseLoCo": {**SPARSELOCO, "dct": False}})
    assert validate_state(raw).ok and "no DCT" in str(raw.model.optimizer)
    assert optimizer_settings(raw.model.optimizer).dct is False  # type: ignore[union-attr]
    assert parse_state(tomllib.loads(tomli_w.dumps(raw.to_toml_dict()))) == raw


@pytest.mark.parametrize(
    ("values", "words", "kind"),
    [
        ({"quantize_codebook": True}, "2-bit codebook", "TWO_BIT_CODEBOOK"),
        ({"quantize_2bit": False, "quantize_4bit": True}, "4-bit", "FOUR_BIT"),
    ],
)
def test_sparseloco_value_codes_are_optional_and_reach_the_trainer(
    values: dict[str, bool], words: str, kind: str
) -> None:
    plain = state_with({"SparseLoCo": dict(SPARSELOCO)})
    assert isinstance(plain.model.optimizer, SparseLocoOptimizer)
    toml = plain.model.optimizer.to_toml()
    assert "quantize_codebook" not in toml and "quantize_4bit" not in toml
    assert optimizer_settings(plain.model.optimizer).value_kind.name == "TWO_BIT"  # type: ignore[union-attr]
    chosen = state_with({"SparseLoCo": {**SPARSELOCO, **values}})
    assert validate_state(chosen).ok
    assert words in str(chosen.model.optimizer)
    assert optimizer_settings(chosen.model.optimizer).value_kind.name == kind  # type: ignore[union-attr]
    assert parse_state(tomllib.loads(tomli_w.dumps(chosen.to_toml_dict()))) == chosen


@pytest.mark.parametrize(
    ("values", "field", "words"),
    [
        ({"quantize_4bit": True}, "quantize_4bit", "quantize_4bit and quantize_2bit cannot"),
        (
            {"quantize_2bit": False, "quantize_codebook": True},
            "quantize_codebook",
            "quantize_codebook needs quantize_2bit = true",
        ),
    ],
)
def test_sparseloco_value_codes_that_cannot_go_together_name_the_field(
    values: dict[str, bool], field: str, words: str
) -> None:
    report = validate_state(state_with({"SparseLoCo": {**SPARSELOCO, **values}}))
    assert [p.field for p in report.errors] == [f"model.LLM.optimizer.SparseLoCo.{field}"]
    assert words in report.errors[0].message
