"""Whether a run's data lasts the run: samples needed (batch ramp, resumed runs) against the
sequences its token files hold (data server's data.toml, Local directories)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from psyche_common.config import DataServerConfig, StateFile, parse_state
from psyche_common.data.supply import (
    data_files_problem,
    samples_held,
    samples_needed,
    supply_warning,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SEQ_LEN = 256  # the example's max_seq_len


def state_with(config: dict[str, int] | None = None, **llm: Any) -> StateFile:
    document = tomllib.loads((REPO_ROOT / "state.toml.example").read_text())
    document["config"].update(config or {})
    document["model"]["LLM"].update(llm)
    return parse_state(document)


def token_dir(tmp_path: Path, *sequences: float) -> Path:
    """A folder of u16 token files holding the given numbers of sequences (fractions: a tail
    shorter than a sequence, which is not used)."""
    directory = tmp_path / "tokens"
    directory.mkdir()
    for number, count in enumerate(sequences):
        tokens = np.arange(int(count * SEQ_LEN), dtype="<u2")
        (directory / f"{number:02d}.bin").write_bytes(tokens.tobytes())
    return directory


def test_a_constant_batch_needs_batch_times_the_trained_steps() -> None:
    # steps 1 .. total_steps - 1 train, 8 samples each
    assert samples_needed(state_with({"total_steps": 200})) == 199 * 8


def test_a_resumed_run_needs_only_what_is_left_after_its_cursor() -> None:
    document = tomllib.loads((REPO_ROOT / "state.toml.example").read_text())
    document["progress"] = {"epoch": 3, "step": 51, "epoch_start_data_index": 400}
    assert samples_needed(parse_state(document)) == 400 + (200 - 51) * 8


def test_the_batch_ramp_is_followed_round_by_round() -> None:
    config = {
        "total_steps": 6,
        "global_batch_size_start": 2,
        "global_batch_size_end": 8,
        "global_batch_size_warmup_tokens": 12 * SEQ_LEN,
    }
    # the cursor after each of the 5 trained steps: 0 -> 2 (2 + 6 * 0/12), -> 5 (+3),
    # -> 10 (+4.5, rounded away from zero), -> 17 (+7), -> 25 (past the ramp: +8)
    assert samples_needed(state_with(config)) == 25


def test_local_directory_and_data_server_files_are_counted(tmp_path: Path) -> None:
    directory = token_dir(tmp_path, 10, 5.5)
    local = state_with(data_location={"Local": str(directory)})
    assert samples_held(local, None) == (15, str(directory))
    server = state_with(data_location={"Server": "127.0.0.1:20001"})
    data = DataServerConfig(
        dir=directory, token_size="TwoBytes", seq_len=SEQ_LEN, shuffle_seed=tuple(range(32))
    )
    held = samples_held(server, data)
    assert held is not None and held[0] == 15


@pytest.mark.parametrize(
    "location", [{"Builtin": "python-stdlib"}, "Dummy", {"Local": "/no/such/dir"}]
)
def test_data_that_cannot_be_sized_here_gives_no_warning(location: Any) -> None:
    assert supply_warning(state_with(data_location=location), None) is None


def test_the_warning_names_both_numbers_and_only_when_short(tmp_path: Path) -> None:
    directory = token_dir(tmp_path, 24)
    short = supply_warning(state_with(data_location={"Local": str(directory)}), None)
    assert short is not None and short.field == "config.total_steps"
    assert "needs 1,592 samples" in short.message and "holds 24" in short.message
    enough = state_with({"total_steps": 4}, data_location={"Local": str(directory)})
    assert supply_warning(enough, None) is None  # 3 steps x 8 = 24


def test_a_data_dir_with_token_files_only_in_subfolders_warns(tmp_path: Path) -> None:
    nested = token_dir(tmp_path, 4)
    outer = tmp_path
    config = DataServerConfig(
        dir=outer, token_size="TwoBytes", seq_len=SEQ_LEN, shuffle_seed=tuple(range(32))
    )
    problem = data_files_problem(config)
    assert problem is not None and problem.field == "data.dir"
    assert "No training data files" in problem.message and "folders tokens" in problem.message
    assert data_files_problem(config.model_copy(update={"dir": nested})) is None
