"""`model.LLM.architecture` against the model: what validate-config and the client refuse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from psyche_client.training.distro_backend import DistroBackend
from psyche_client.training.model.loading import ModelLoadError
from psyche_common.config import Architecture, validate_state
from psyche_common.config.architecture_rules import model_config_problem
from psyche_common.config.loading import parse_state
from psyche_common.coordinator import RunState

from tests.support.coordinators import coordinator_in, distro_model, ids, state_document
from tests.support.model_families import FAMILIES, short_directory, write_family

FIELD = "model.LLM.architecture"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with short_directory() as directory:
        yield directory


def problems(architecture: str, repo_id: str) -> tuple[list[str], list[str], list[str]]:
    """(error fields, error messages, warning messages) of validate-config on a run."""
    document = state_document(
        model={"architecture": architecture, "checkpoint": {"Hub": {"repo_id": repo_id}}}
    )
    report = validate_state(parse_state(document))
    return (
        [p.field for p in report.errors],
        [p.message for p in report.errors],
        [p.message for p in report.warnings],
    )


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_validates_under_its_architecture(family, short_tmp: Path) -> None:
    model = write_family(short_tmp / "m", family)
    fields, _, warnings = problems(family.architecture, str(model))
    assert fields == [] and warnings == []
    fields, _, _ = problems("HfAuto", str(model))  # HfAuto takes every family
    assert fields == []


@pytest.mark.parametrize(
    ("architecture", "name", "suggested"),
    [
        ("HfLlama", "qwen2-tied", "HfAuto"),
        ("HfLlama", "deepseek-v3", "HfDeepseek"),
        ("HfDeepseek", "llama", "HfLlama"),
        ("HfDeepseek", "gemma2", "HfAuto"),
    ],
)
def test_a_model_of_another_family_is_refused_naming_the_field(
    architecture: str, name: str, suggested: str, short_tmp: Path
) -> None:
    model = write_family(short_tmp / "m", name)
    fields, messages, _ = problems(architecture, str(model))
    assert fields == [FIELD]
    assert f'set architecture = "{suggested}"' in messages[0]
    assert "config.json model_type" in messages[0] and str(model) in messages[0]


def test_torchtitan_takes_any_family_as_hfauto_with_a_warning(short_tmp: Path) -> None:
    model = write_family(short_tmp / "m", "gemma2")
    fields, _, warnings = problems("Torchtitan", str(model))
    assert fields == []
    assert [w for w in warnings if '"Torchtitan" is not used' in w]


def test_a_local_model_this_machine_lacks_is_a_warning(short_tmp: Path) -> None:
    fields, _, warnings = problems("HfLlama", str(short_tmp / "absent"))
    assert fields == []
    assert "does not exist on this machine" in warnings[0]
    (short_tmp / "empty").mkdir()
    _, _, warnings = problems("HfLlama", str(short_tmp / "empty"))
    assert "has no config.json" in warnings[0]


def test_an_unreadable_or_typeless_config_is_refused(short_tmp: Path) -> None:
    (short_tmp / "bad").mkdir()
    (short_tmp / "bad" / "config.json").write_text("{not json")
    fields, messages, _ = problems("HfAuto", str(short_tmp / "bad"))
    assert fields == ["model.LLM.checkpoint.Hub.repo_id"] and "cannot read" in messages[0]
    (short_tmp / "bad" / "config.json").write_text(json.dumps({"hidden_size": 8}))
    fields, messages, _ = problems("HfAuto", str(short_tmp / "bad"))
    assert fields == [FIELD] and "has no model_type" in messages[0]


def test_hub_and_builtin_models_are_left_to_the_client() -> None:
    for repo_id in ("builtin:llama-tiny", "Qwen/Qwen2.5-0.5B"):
        assert problems("HfDeepseek", repo_id) == ([], [], [])


def test_the_client_refuses_a_model_its_architecture_does_not_train(short_tmp: Path) -> None:
    """Before building anything: from the checkpoint's directory, from a builtin preset, and
    from a config shared by peers."""
    model = write_family(short_tmp / "m", "qwen2")
    llm = distro_model(str(model), chunk=16, topk=4) | {"architecture": "HfLlama"}
    with pytest.raises(ModelLoadError, match=r'architecture "HfLlama" trains .*\'qwen2\''):
        DistroBackend.load(
            coordinator_in(RunState.Warmup, ids(2), model=llm), device="cpu", micro_batch_size=1
        )
    llm = distro_model("builtin:llama-tiny", chunk=16, topk=4) | {"architecture": "HfDeepseek"}
    coordinator = coordinator_in(RunState.Warmup, ids(2), model=llm)
    with pytest.raises(ModelLoadError, match="model builtin:llama-tiny is 'llama'"):
        DistroBackend.load(coordinator, device="cpu", micro_batch_size=1)
    shared = json.loads((model / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="model shared by peers is 'qwen2'"):
        DistroBackend.load(coordinator, device="cpu", micro_batch_size=1, peer_config=shared)


def test_model_config_problem_accepts_what_each_architecture_names() -> None:
    assert model_config_problem(Architecture.HF_LLAMA, {"model_type": "llama"}, "m") is None
    for model_type in ("deepseek_v3", "deepseek_v2"):
        config = {"model_type": model_type}
        assert model_config_problem(Architecture.HF_DEEPSEEK, config, "m") is None
    for free in (Architecture.HF_AUTO, Architecture.TORCHTITAN):
        assert model_config_problem(free, {"model_type": "anything"}, "m") is None
