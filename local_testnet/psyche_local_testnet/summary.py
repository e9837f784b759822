"""End-of-run summary from the clients' JSON log files (pure parsing and aggregation).

Each client incarnation writes `client-<n>.<incarnation>.jsonl` (incarnation 0 is the first
start, 1 the first restart after a kill, ...). A line is one JSON object; the fields used are
`ts`, `client_id`, `epoch`, `step`, `state`, `loss`, `weights_hash` (and `msg`). Other lines
are skipped.

Weights hashes are compared between clients for the same (epoch, step, msg): the same log
statement at the same step must report the same weights on every client. After a server restart
the steps in flight at the kill are trained again from other weights, so hashes are compared
only within one server era (`server_eras`). The run counts as finished when a client line has
`state` "Finished" or the server's JSON log has a run-state change with `new_state` "Finished".
Server restarts (`--kill-server-at`) come from the launcher: when each kill happened and the
step its saved state resumed at, and why a planned restart failed (which fails the run).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from psyche_local_testnet.server_eras import server_eras

LOG_NAME = re.compile(r"^client-(\d+)\.(\d+)\.jsonl$")
FINISHED_STATE = "Finished"


def log_file_name(client_number: int, incarnation: int) -> str:
    return f"client-{client_number}.{incarnation}.jsonl"


@dataclass(frozen=True)
class ClientLogRecord:
    """The fields of one client log line that the summary uses."""

    client_number: int
    incarnation: int
    client_id: str | None = None
    epoch: int | None = None
    step: int | None = None
    state: str | None = None
    loss: float | None = None
    weights_hash: str | None = None
    msg: str | None = None
    ts: float | None = None  # wall-clock seconds (the line's `ts`)


@dataclass(frozen=True)
class ServerRestart:
    """One server restart done by the launcher."""

    killed_at: float  # wall-clock seconds (time.time()) just before the SIGKILL
    resumed_step: int  # the `[progress] step` of the saved state it resumed from


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _timestamp(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def parse_log_line(line: str, client_number: int, incarnation: int) -> ClientLogRecord | None:
    """One record, or None for a line that is not a JSON object."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return ClientLogRecord(
        client_number=client_number,
        incarnation=incarnation,
        client_id=_str(data.get("client_id")),
        epoch=_int(data.get("epoch")),
        step=_int(data.get("step")),
        state=_str(data.get("state")),
        loss=_float(data.get("loss")),
        weights_hash=_str(data.get("weights_hash")),
        msg=_str(data.get("msg")),
        ts=_timestamp(data.get("ts")),
    )


def line_reports_finished(line: str) -> bool:
    """Whether a JSON log line (client or server) says the run reached Finished."""
    text = line.strip()
    if '"Finished"' not in text:
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and FINISHED_STATE in (data.get("state"), data.get("new_state"))


def server_log_reports_finished(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as lines:
        return any(line_reports_finished(line) for line in lines)


def parse_log_lines(
    lines: Iterable[str], client_number: int, incarnation: int
) -> list[ClientLogRecord]:
    records = (parse_log_line(line, client_number, incarnation) for line in lines)
    return [r for r in records if r is not None]


def read_client_logs(directory: Path) -> list[ClientLogRecord]:
    """Every record of every `client-<n>.<inc>.jsonl` file in `directory`."""
    records: list[ClientLogRecord] = []
    if not directory.is_dir():
        return records
    for path in sorted(directory.iterdir()):
        match = LOG_NAME.match(path.name)
        if not match:
            continue
        with path.open(encoding="utf-8", errors="replace") as lines:
            records += parse_log_lines(lines, int(match.group(1)), int(match.group(2)))
    return records


@dataclass(frozen=True)
class Summary:
    """What happened in a testnet run."""

    first_step: int | None
    last_step: int | None
    kills: int
    rejoins: int
    loss_start: float | None
    loss_end: float | None
    hash_points_compared: int
    hash_mismatches: list[str] = field(default_factory=list)
    clients_seen: int = 0
    finished: bool = False
    server_resume_steps: list[int] = field(default_factory=list)
    server_restart_error: str | None = None

    @property
    def server_restarts(self) -> int:
        return len(self.server_resume_steps)

    @property
    def advanced(self) -> bool:
        return (
            self.first_step is not None
            and self.last_step is not None
            and self.last_step > self.first_step
        )

    @property
    def hashes_agree(self) -> bool:
        return self.hash_points_compared > 0 and not self.hash_mismatches

    @property
    def ok(self) -> bool:
        return self.advanced and self.hashes_agree and self.server_restart_error is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "advanced": self.advanced,
            "kills": self.kills,
            "rejoins": self.rejoins,
            "loss_start": self.loss_start,
            "loss_end": self.loss_end,
            "hashes_agree": self.hashes_agree,
            "hash_points_compared": self.hash_points_compared,
            "hash_mismatches": self.hash_mismatches,
            "clients_seen": self.clients_seen,
            "finished": self.finished,
            "server_restarts": self.server_restarts,
            "server_resume_steps": self.server_resume_steps,
            "server_restart_error": self.server_restart_error,
        }

    def render_lines(self) -> list[str]:
        def loss(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.4f}"

        steps = "no training step logged"
        if self.first_step is not None:
            steps = f"{self.first_step} -> {self.last_step}"
        if self.hashes_agree:
            hashes = f"agree ({self.hash_points_compared} points compared)"
        elif self.hash_mismatches:
            hashes = f"DISAGREE at {', '.join(self.hash_mismatches[:5])}"
        else:
            hashes = "not compared (fewer than two clients reported a hash for any step)"
        restarts = str(self.server_restarts)
        if self.server_resume_steps:
            steps_at = ", ".join(map(str, self.server_resume_steps))
            restarts += f" (resumed at step {steps_at})"
        if self.server_restart_error is not None:
            restarts += f"; FAILED: {self.server_restart_error}"
        rows = [
            ("steps", f"{steps}{' (run finished)' if self.finished else ''}"),
            ("clients seen", str(self.clients_seen)),
            ("kills", str(self.kills)),
            ("rejoins", str(self.rejoins)),
            ("server restarts", restarts),
            ("loss", f"{loss(self.loss_start)} -> {loss(self.loss_end)}"),
            ("weights hashes", hashes),
            ("result", "OK" if self.ok else "FAILED"),
        ]
        return [f"{label + ':':<17}{value}" for label, value in rows]

    def final_line(self) -> str:
        return "summary: " + json.dumps(self.to_dict(), sort_keys=True)


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def summarize(
    records: Iterable[ClientLogRecord],
    kills: int = 0,
    server_finished: bool = False,
    server_restarts: Iterable[ServerRestart] = (),
    server_restart_error: str | None = None,
) -> Summary:
    """Aggregate client log records into a Summary (see the module doc for the rules);
    `server_finished` says the server logged the run reaching Finished; `server_restarts` are
    the launcher's server restarts, in order; `server_restart_error` says why a planned restart
    failed (the run is then not ok)."""
    records = list(records)
    restarts = list(server_restarts)
    eras = server_eras(records, [restart.killed_at for restart in restarts])
    losses: dict[int, list[float]] = defaultdict(list)
    hashes: dict[tuple[int, int | None, int, str | None], dict[str, set[int]]] = defaultdict(
        lambda: defaultdict(set)
    )
    rejoined: set[tuple[int, int]] = set()
    for r, era in zip(records, eras, strict=True):
        if r.step is not None and r.loss is not None:
            losses[r.step].append(r.loss)
            if r.incarnation > 0:
                rejoined.add((r.client_number, r.incarnation))
        if r.step is not None and r.weights_hash is not None:
            point = (era, r.epoch, r.step, r.msg if r.msg is not None else r.state)
            hashes[point][r.weights_hash].add(r.client_number)
    compared = 0
    mismatches: list[str] = []
    for (era, epoch, step, what), by_hash in sorted(
        hashes.items(), key=lambda item: (item[0][2], item[0][0], item[0][1] or 0, item[0][3] or "")
    ):
        reporters = set().union(*by_hash.values())
        if len(reporters) < 2:
            continue
        compared += 1
        if len(by_hash) > 1:
            where = f"step {step}" + (f" epoch {epoch}" if epoch is not None else "")
            where = f"{where} ({what})" if what else where
            mismatches.append(where + (f" after server restart {era}" if era else ""))
    steps = sorted(losses)
    return Summary(
        first_step=steps[0] if steps else None,
        last_step=steps[-1] if steps else None,
        kills=kills,
        rejoins=len(rejoined),
        loss_start=_mean(losses[steps[0]]) if steps else None,
        loss_end=_mean(losses[steps[-1]]) if steps else None,
        hash_points_compared=compared,
        hash_mismatches=mismatches,
        clients_seen=len({r.client_number for r in records}),
        finished=server_finished or any(r.state == FINISHED_STATE for r in records),
        server_resume_steps=[restart.resumed_step for restart in restarts],
        server_restart_error=server_restart_error,
    )
