"""Our rules beyond the reference's: LR schedules (`lr_rules`), what the client cannot load or
use (`support_rules`), DisTrO's `compression_decay`; each names the field at fault."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from psyche_common.config import StateFile, load_state, parse_state, validate_state
from psyche_common.config.builtin_models import BUILTIN_MODELS

REPO_ROOT = Path(__file__).resolve().parents[2]


def example_document() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "state.toml.example").read_text())


def state_with(total_steps: int | None = None, **llm_changes: Any) -> StateFile:
    document = example_document()
    document["model"]["LLM"].update(llm_changes)
    if total_steps is not None:
        document["config"]["total_steps"] = total_steps
    return parse_state(document)


def fields(problems: list[Any]) -> list[str]:
    return [problem.field for problem in problems]


def cosine(**changes: Any) -> dict[str, Any]:
    table = {
        "base_lr": 4e-4,
        "warmup_steps": 10,
        "warmup_init_lr": 0.0,
        "total_steps": 200,
        "final_lr": 4e-5,
    }
    return {"Cosine": {**table, **changes}}


def test_a_cosine_that_ends_before_the_run_warns_naming_both_step_counts() -> None:
    report = validate_state(state_with(total_steps=500, lr_schedule=cosine(total_steps=200)))
    assert report.ok
    assert fields(report.warnings) == ["model.LLM.lr_schedule.Cosine.total_steps"]
    message = report.warnings[0].message
    assert "(200)" in message and "config.total_steps 500" in message and "climbs" in message


@pytest.mark.parametrize("schedule_steps", [500, 800])
def test_a_cosine_that_lasts_the_run_is_quiet(schedule_steps: int) -> None:
    report = validate_state(
        state_with(total_steps=500, lr_schedule=cosine(total_steps=schedule_steps))
    )
    assert report.ok and report.warnings == []


def test_a_flat_cosine_cannot_climb_and_is_quiet() -> None:
    flat = cosine(total_steps=200, final_lr=4e-4)
    assert validate_state(state_with(total_steps=500, lr_schedule=flat)).warnings == []


@pytest.mark.parametrize(
    ("schedule", "field"),
    [
        (cosine(base_lr=-1e-3), "model.LLM.lr_schedule.Cosine.base_lr"),
        (cosine(final_lr=-1e-5), "model.LLM.lr_schedule.Cosine.final_lr"),
        (cosine(warmup_init_lr=-1e-6), "model.LLM.lr_schedule.Cosine.warmup_init_lr"),
        (
            {"Constant": {"base_lr": -0.1, "warmup_steps": 0, "warmup_init_lr": 0.0}},
            "model.LLM.lr_schedule.Constant.base_lr",
        ),
        (
            {
                "WarmupStableDecay": {
                    "base_lr": 1e-3,
                    "warmup_steps": 10,
                    "warmup_init_lr": 0.0,
                    "stable_steps": 10,
                    "cosine_decay_steps": 10,
                    "cosine_decay_final_lr": 1e-4,
                    "linear_decay_steps": 10,
                    "linear_decay_final_lr": -1e-5,
                }
            },
            "model.LLM.lr_schedule.WarmupStableDecay.linear_decay_final_lr",
        ),
    ],
)
def test_a_negative_learning_rate_is_an_error(schedule: dict[str, Any], field: str) -> None:
    report = validate_state(state_with(lr_schedule=schedule))
    assert field in fields(report.errors)
    assert "must not be negative" in str(report.errors)


@pytest.mark.parametrize("decay", [1.5, -0.5])
@pytest.mark.parametrize("kind", ["Distro", "SparseLoCo"])
def test_compression_decay_outside_0_1_is_an_error(decay: float, kind: str) -> None:
    optimizer = example_document()["model"]["LLM"]["optimizer"]
    if kind == "SparseLoCo":
        sparse = tomllib.loads((REPO_ROOT / "state.sparseloco.toml.example").read_text())
        optimizer = sparse["model"]["LLM"]["optimizer"]
    optimizer[kind]["compression_decay"] = decay
    report = validate_state(state_with(optimizer=optimizer))
    assert fields(report.errors) == [f"model.LLM.optimizer.{kind}.compression_decay"]
    assert f"({decay})" in report.errors[0].message


@pytest.mark.parametrize("decay", [0.0, 0.999, 1.0])
def test_compression_decay_in_0_1_is_valid(decay: float) -> None:
    optimizer = example_document()["model"]["LLM"]["optimizer"]
    optimizer["Distro"]["compression_decay"] = decay
    assert validate_state(state_with(optimizer=optimizer)).ok


def test_a_gcs_checkpoint_is_refused_and_a_p2p_gcs_one_warns() -> None:
    gcs = validate_state(state_with(checkpoint={"Gcs": {"bucket": "weights"}}))
    assert fields(gcs.errors) == ["model.LLM.checkpoint.Gcs"]
    assert "gs://weights" in gcs.errors[0].message and "cannot load" in gcs.errors[0].message
    p2p = validate_state(state_with(checkpoint={"P2PGcs": {"bucket": "weights"}}))
    assert p2p.ok and fields(p2p.warnings) == ["model.LLM.checkpoint.P2PGcs"]


def test_torchtitan_warns_that_the_client_ignores_it() -> None:
    report = validate_state(state_with(architecture="Torchtitan"))
    assert report.ok
    assert fields(report.warnings) == ["model.LLM.architecture"]
    assert "transformers" in report.warnings[0].message


@pytest.mark.parametrize("kind", ["Hub", "Dummy", "P2P"])
def test_an_unknown_builtin_model_is_an_error_naming_the_known_ones(kind: str) -> None:
    report = validate_state(state_with(checkpoint={kind: {"repo_id": "builtin:llama-3m"}}))
    assert fields(report.errors) == [f"model.LLM.checkpoint.{kind}.repo_id"]
    assert "'builtin:llama-3m'" in report.errors[0].message
    assert "builtin:llama-2m" in report.errors[0].message


@pytest.mark.parametrize("name", BUILTIN_MODELS)
def test_every_shipped_builtin_model_is_valid(name: str) -> None:
    assert validate_state(state_with(checkpoint={"Hub": {"repo_id": f"builtin:{name}"}})).ok


def test_the_consilience_fixture_warns_about_its_short_cosine(shared_fixtures: Path) -> None:
    path = shared_fixtures / "configs" / "consilience-match-llama2-20m-fineweb-pretrain-dev"
    report = validate_state(load_state(path / "state.toml"))
    assert report.ok
    assert "model.LLM.lr_schedule.Cosine.total_steps" in fields(report.warnings)
