"""The server's start-up config checks and the run summary (regressions from real runs)."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest
from psyche_common.config import parse_state, summary_lines
from psyche_server.runner import load_checked_run

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_server_data_run(tmp_path: Path) -> tuple[Path, Path]:
    text = (REPO_ROOT / "state.toml.example").read_text()
    text = text.replace(
        'data_location = { Builtin = "python-stdlib" }',
        'data_location = { Server = "127.0.0.1:20001" }',
    )
    state = tmp_path / "state.toml"
    state.write_text(text)
    (tmp_path / "tokens").mkdir()
    data = tmp_path / "data.toml"
    data.write_text(
        'dir = "tokens"\ntoken_size = "TwoBytes"\nseq_len = 256\n'
        f"shuffle_seed = [{', '.join(['1'] * 32)}]\n"
    )
    return state, data


def test_no_data_config_warning_when_one_is_passed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: `run --data-config data.toml` still warned that it needs --data-config."""
    state, data = write_server_data_run(tmp_path)
    with caplog.at_level(logging.WARNING):
        load_checked_run(state, data)
    assert "--data-config" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_checked_run(state)
    assert "--data-config" in caplog.text


def test_summary_names_a_p2p_checkpoint_once() -> None:
    """Regression: the summary printed `checkpoint: P2P P2P - Hub repo: …`."""
    document = tomllib.loads((REPO_ROOT / "state.toml.example").read_text())
    document["model"]["LLM"]["checkpoint"] = {"P2P": {"repo_id": "org/model"}}
    lines = summary_lines(parse_state(document))
    checkpoint = next(line for line in lines if "checkpoint" in line)
    assert checkpoint.count("P2P") == 1, checkpoint
    assert "org/model" in checkpoint
    document["model"]["LLM"]["checkpoint"] = {"Hub": {"repo_id": "org/model"}}
    hub = next(line for line in summary_lines(parse_state(document)) if "checkpoint" in line)
    assert "Hub" in hub and "org/model" in hub
