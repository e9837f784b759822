"""Whether this client's network is fast enough for the run: how fast one round's results
arrive, against what the round time needs.

Every round counts, in a `BusyMeter`, the bytes of the peers' results this client fetched and
the time during which at least one of those fetches was under way (fetches run concurrently
and share the link, so their times are not summed). When the round's results are applied,
`link_verdict` projects, at the measured rate, how long all of the round's results take:
every result a trainer other than us announced, fetched or not (a fetch cut short still
measured its rate). When that exceeds `max_round_train_time`, the client cannot keep up: it
logs a warning naming the measured rate, the time the round's results take at it and the
rate the run needs, and the dashboard shows it (`ClientStats.link_warning`). The rate is what
reached this client: its own downlink, or the uplinks of the peers it fetched from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from psyche_common.announcements import ResultAnnouncement
from psyche_common.pacing import MEGABIT


@dataclass
class BusyMeter:
    """Bytes moved by possibly concurrent transfers, and the wall time during which at least
    one was under way."""

    clock: Callable[[], float] = time.monotonic
    bytes: int = 0
    transfers: int = 0
    _active: int = 0
    _since: float = 0.0
    _busy: float = field(default=0.0, repr=False)

    def begin(self) -> None:
        if self._active == 0:
            self._since = self.clock()
        self._active += 1

    def end(self, nbytes: int) -> None:
        """A transfer begun with `begin` ended having moved `nbytes` (0 when it failed)."""
        if self._active <= 0:
            raise RuntimeError("BusyMeter.end() without a matching begin()")
        self._active -= 1
        self.bytes += nbytes
        self.transfers += 1
        if self._active == 0:
            self._busy += self.clock() - self._since

    def busy(self) -> float:
        """Seconds during which at least one transfer was under way (so far)."""
        running = self.clock() - self._since if self._active else 0.0
        return self._busy + running


@dataclass(frozen=True)
class LinkVerdict:
    """One round's result traffic against the round time."""

    step: int
    results: int
    """Results of other trainers announced in the round."""
    needed_bytes: int
    fetched_bytes: int
    busy: float
    round_time: float

    @property
    def rate(self) -> float:
        """Measured bytes/s of the round's result fetches."""
        return self.fetched_bytes / self.busy if self.busy > 0 else float("inf")

    @property
    def projected(self) -> float:
        """Seconds all of the round's results take at the measured rate."""
        return self.needed_bytes / self.rate

    @property
    def needed_rate(self) -> float:
        """Bytes/s that move the round's results within the round time."""
        return self.needed_bytes / self.round_time

    @property
    def too_slow(self) -> bool:
        return self.projected > self.round_time

    def describe(self) -> str:
        return (
            f"the link is too slow for this run: results of step {self.step} arrived at "
            f"{mbit(self.rate):.2f} Mbit/s, so the round's {self.results} results "
            f"({self.needed_bytes} bytes) take {self.projected:.1f} s, more than the run's "
            f"round time (max_round_train_time {self.round_time:g} s); the run needs at least "
            f"{mbit(self.needed_rate):.2f} Mbit/s down (this client's downlink, or its peers' "
            f"uplinks)"
        )

    def summary(self) -> str:
        """One line for the dashboard."""
        state = "TOO SLOW" if self.too_slow else "ok"
        return (
            f"{state}: step {self.step} results at {mbit(self.rate):.2f} Mbit/s "
            f"({self.projected:.1f} s of {self.round_time:g} s round time; needs "
            f"{mbit(self.needed_rate):.2f} Mbit/s)"
        )


def mbit(bytes_per_second: float) -> float:
    return bytes_per_second / MEGABIT


class AnnouncedDownload(Protocol):
    """One announced result of a round (`state.ResultDownload`)."""

    @property
    def announcement(self) -> ResultAnnouncement: ...


class MeasuredRound(Protocol):
    """What the verdict reads of a round (`state.RoundState`, which holds a `BusyMeter`:
    this module does not import it back)."""

    @property
    def step(self) -> int: ...

    @property
    def fetches(self) -> BusyMeter: ...

    @property
    def downloads(self) -> Mapping[bytes, AnnouncedDownload]: ...


def link_verdict(round_: MeasuredRound, me: bytes, round_time: float) -> LinkVerdict | None:
    """The round's verdict; None when this client fetched nothing in it (nothing measured)."""
    meter = round_.fetches
    busy = meter.busy()
    if meter.transfers == 0 or meter.bytes == 0 or busy <= 0:
        return None
    others = [d for d in round_.downloads.values() if d.announcement.sender_id != me]
    return LinkVerdict(
        step=round_.step,
        results=len(others),
        needed_bytes=sum(d.announcement.size for d in others),
        fetched_bytes=meter.bytes,
        busy=busy,
        round_time=round_time,
    )
