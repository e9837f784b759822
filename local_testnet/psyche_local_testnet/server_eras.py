"""Which server process each client log line belongs to, when the server was restarted (pure).

A restarted server resumes the run at its saved step, so the steps that were in flight when it
was killed are trained again, from the weights the clients held before them: a client may log
the same statement at the same step twice, with different weights, once for each server. The
summary compares weights hashes only within one server era: era 0 is the first server, era k
the server after the k-th restart.

The era of a line follows its client incarnation (one log file): an incarnation started after
a restart's kill began with the new server; one that was running at the kill moves to the new
era at its first `reconnected to the server` line after the kill (the client's lines up to then
describe the old server's rounds, even when logged after the kill).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

RECONNECTED_MSG = "reconnected to the server"


class EraRecord(Protocol):
    """What the era of a client log line depends on."""

    @property
    def client_number(self) -> int: ...

    @property
    def incarnation(self) -> int: ...

    @property
    def ts(self) -> float | None: ...

    @property
    def msg(self) -> str | None: ...


def server_eras(records: Sequence[EraRecord], killed_at: Sequence[float]) -> list[int]:
    """The era of each record (same order). `records` holds each incarnation's lines in file
    order; `killed_at` the wall-clock times of the restarts' kills."""
    eras: list[int] = []
    current: dict[tuple[int, int], int] = {}
    for record in records:
        key = (record.client_number, record.incarnation)
        if key not in current:  # its first line: the kills before it are behind it
            current[key] = _kills_until(killed_at, record.ts, strictly_before=True)
        if record.msg == RECONNECTED_MSG:
            current[key] = max(current[key], _kills_until(killed_at, record.ts))
        eras.append(current[key])
    return eras


def _kills_until(
    killed_at: Sequence[float], ts: float | None, strictly_before: bool = False
) -> int:
    if ts is None:
        return 0
    return sum(1 for k in killed_at if k < ts or (k == ts and not strictly_before))
