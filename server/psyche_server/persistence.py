"""Saving the coordinator at each successful epoch end and loading it back to resume.

A saved file is an ordinary state.toml (what `psyche-server run --state` reads), written
atomically as `{save_dir}/{run_id}-step{N}.toml` where N is the last completed step. Ephemeral
parts (run state, client lists) are reset first, so a restart resumes epoch, step and data
cursor with a fresh membership.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import tomli_w
from psyche_common.atomic_file import atomic_writer
from psyche_common.coordinator import Coordinator


def saved_state_name(run_id: str, last_step: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)
    return f"{safe}-step{last_step}.toml"


def state_toml_document(coordinator: Coordinator) -> dict[str, Any]:
    """The TOML document of a copy of `coordinator` with its ephemeral state reset."""
    snapshot = copy.deepcopy(coordinator)
    snapshot.reset_ephemeral()
    return snapshot.to_state_file().to_toml_dict()


def write_atomically(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` so that a crash never leaves a partial state file."""
    with atomic_writer(path) as handle:
        handle.write(text.encode("utf-8"))


def save_state(coordinator: Coordinator, save_dir: Path) -> Path:
    """Write the coordinator's resumable state; returns the file written."""
    document = state_toml_document(coordinator)
    last_step = coordinator.progress.step - 1
    path = Path(save_dir) / saved_state_name(coordinator.run_id, last_step)
    write_atomically(path, tomli_w.dumps(document))
    return path
