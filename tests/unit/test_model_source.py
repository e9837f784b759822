"""How a checkpoint repo id is classified: from its text alone, never from the disk."""

from __future__ import annotations

import pytest
from psyche_common.model_source import SourceKind, classify_source


@pytest.mark.parametrize(
    "source",
    ["gpt2", "org/model", "emozilla/llama2-20m-init", "Org_1/model.v2", "a-b/c_d"],
)
def test_repo_ids_are_hub_repos(source: str) -> None:
    assert classify_source(source) == SourceKind.HUB


@pytest.mark.parametrize(
    "source",
    [
        "/abs/model",
        "./org/model",
        "../models/m",
        "~/models/m",
        "checkpoints/run/step-9",
        ".",
        "..",
        "org/../etc",
        "org/model/",
        ".hidden",
        "-flag",
        "org/",
        "/",
    ],
)
def test_paths_are_local(source: str) -> None:
    assert classify_source(source) == SourceKind.LOCAL


def test_builtin_presets() -> None:
    assert classify_source("builtin:llama-tiny") == SourceKind.BUILTIN


def test_the_server_knows_every_builtin_preset_the_client_ships() -> None:
    """`validate-config` (no torch) checks `builtin:NAME` against a list of its own."""
    from psyche_client.training.model.loading import list_builtin_presets
    from psyche_common.config.builtin_models import BUILTIN_MODELS

    assert sorted(BUILTIN_MODELS) == list_builtin_presets()
