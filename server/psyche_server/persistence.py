"""Saving the coordinator so that a restarted server resumes the run where the clients are.

Every file is an ordinary state.toml (what `psyche-server run --state` reads), written
atomically (a crash leaves the old file or the new one, never a part; the file and then the
directory are fsynced, so a power loss cannot undo a completed save) in the save directory:

- `{run_id}-latest.toml`: where a restart resumes, `resume.resume_point` of the live
  coordinator. `StateSaver.update` rewrites it whenever that point changes (at startup, at each
  round and run-state change, at each epoch end; not during Warmup, whose point is the one
  saved before it), and `StateSaver.save_now` once more on shutdown. A SIGKILL therefore loses
  at most the rounds in flight.
- `{run_id}-step{N}.toml`: one per successful epoch end (N = the last completed step), kept.

The saved warmup time is the state file's own, never `--init-warmup-time`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import tomli_w
from psyche_common.atomic_file import atomic_writer
from psyche_common.coordinator import ClientState, Coordinator
from psyche_common.coordinator.resume import has_resume_point, resume_point

log = logging.getLogger("psyche.server")


def _safe(run_id: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)


def saved_state_name(run_id: str, last_step: int) -> str:
    return f"{_safe(run_id)}-step{last_step}.toml"


def latest_state_name(run_id: str) -> str:
    return f"{_safe(run_id)}-latest.toml"


def resume_document(coordinator: Coordinator, warmup_time: int | None = None) -> dict[str, Any]:
    """The TOML document a restart resumes from (not in Warmup: ValueError).

    `warmup_time` replaces the live one (which `--init-warmup-time` may have changed)."""
    point = resume_point(coordinator)
    if point is None:
        raise ValueError("in Warmup the resume point is the one saved before it")
    if warmup_time is not None:
        point.config.warmup_time = warmup_time
    return point.to_state_file().to_toml_dict()


def write_atomically(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` so that a crash never leaves a partial state file."""
    with atomic_writer(path) as handle:
        handle.write(text.encode("utf-8"))


def save_state(coordinator: Coordinator, save_dir: Path, warmup_time: int | None = None) -> Path:
    """Write the state of a successful epoch end as `{run_id}-step{N}.toml`; returns the file."""
    document = resume_document(coordinator, warmup_time)
    last_step = coordinator.progress.step - 1
    path = Path(save_dir) / saved_state_name(coordinator.run_id, last_step)
    write_atomically(path, tomli_w.dumps(document))
    return path


def resume_key(coordinator: Coordinator) -> tuple[Any, ...]:
    """Everything the resume point depends on, cheap to compute at every tick."""
    progress = coordinator.progress
    return (
        coordinator.run_state,
        progress.epoch,
        progress.step,
        progress.epoch_start_data_index,
        coordinator.current_round().height,
        coordinator.model.checkpoint.model_dump(),
        coordinator.pending_pause,
        tuple(c.id for c in coordinator.epoch_state.clients if c.state == ClientState.Healthy),
    )


class StateSaver:
    """Keeps `{run_id}-latest.toml` in `save_dir` equal to the run's resume point."""

    def __init__(self, save_dir: Path, warmup_time: int) -> None:
        self.save_dir = Path(save_dir)
        self.warmup_time = warmup_time
        self.last_path: Path | None = None
        self._last_key: tuple[Any, ...] | None = None

    def path_for(self, coordinator: Coordinator) -> Path:
        return self.save_dir / latest_state_name(coordinator.run_id)

    def update(self, coordinator: Coordinator) -> Path | None:
        """Rewrite the latest file if the resume point changed; returns the file written."""
        if not has_resume_point(coordinator):
            return None
        key = resume_key(coordinator)
        if key == self._last_key:
            return None
        self._last_key = key  # a failed write is retried at the next change, not every tick
        return self._write(coordinator)

    def save_now(self, coordinator: Coordinator) -> Path | None:
        """Write the latest file whatever changed (on shutdown); in Warmup the file written
        before it is already current. Returns the file, or None when there is none."""
        if has_resume_point(coordinator):
            self._last_key = resume_key(coordinator)
            if self._write(coordinator) is None:
                return None
        if self.last_path is not None:
            log.info(
                "saved state on shutdown: %s (step %d)",
                self.last_path,
                coordinator.progress.step,
                extra={"path": str(self.last_path), "step": coordinator.progress.step},
            )
        return self.last_path

    def save_epoch_end(self, coordinator: Coordinator) -> Path | None:
        """Write `{run_id}-step{N}.toml` for the epoch that just ended successfully."""
        try:
            path = save_state(coordinator, self.save_dir, self.warmup_time)
        except OSError as exc:
            log.error("could not save the state to %s: %s", self.save_dir, exc)
            return None
        log.info("saved state to %s", path, extra={"path": str(path)})
        return path

    def _write(self, coordinator: Coordinator) -> Path | None:
        path = self.path_for(coordinator)
        try:
            write_atomically(path, tomli_w.dumps(resume_document(coordinator, self.warmup_time)))
        except OSError as exc:
            log.error(
                "could not save the run's progress to %s: %s",
                path,
                exc,
                extra={"path": str(path), "error": str(exc)},
            )
            return None
        self.last_path = path
        log.debug(
            "saved the run's progress to %s (epoch %d, step %d)",
            path,
            coordinator.progress.epoch,
            coordinator.progress.step,
            extra={"path": str(path)},
        )
        return path
