"""Accepting announcements pushed by peers: decode, de-duplicate, rate, verify, membership.

`AnnouncementInbox.receive` runs the checks cheapest first — strict decoding; not seen before
(a hash of the signed bytes, so a duplicate costs no signature check); signer is a member; the
pushing peer within its rate of new announcements (`rate.PeerRates`: over it, "deferred"
before any signature is checked); both signatures (`announcements.verify_announcement`); an
announcement another peer forwarded within its signer's rate (`signer_rates`: it is charged
to whoever signed it, and the forwarder's charge is given back once the signatures verified,
so a member's announcements relayed by honest peers drain the member's forwarding budget, not
theirs, while a peer pushing forgeries pays for every one, and what a member pushes itself
stays charged to it as the pusher); a result's size within `max_result_size` and at most two
different commitments of a trainer for one batch — and only then hands the announcement to
the app's callback, as a `VerifiedAnnouncement`: the one place an announcement's signatures
are checked (the round pipeline accepts nothing else and does not check again).

A second, different commitment of a trainer for a batch is accepted (and so forwarded like
any new announcement): the two together prove that the trainer equivocated, and every honest
client must hold both to decide alike (the round pipeline reports the proof). A third adds
nothing and is refused.

The callback answers with a `Taken`: `ACCEPTED` (True or None too) is acknowledged and
forwarded; `NOT_NOW` (False too: an announcement for a step too far ahead of this client, or
over its sender's quota, `round.exchange`) is forgotten as if it had never arrived — not
seen, not forwarded, its commitment not counted — so a later copy (the trainer re-announces
every 10 s, a peer's link catch-up) is delivered again; `REFUSED` (a second Finished of a
sender for a step, a result that is not the batch's trainer's, a round already over) stays
seen, so copies cost nothing, and is answered "rejected" and never forwarded: only what the
round pipeline took travels on.

The de-duplication memory is bounded (oldest ids are forgotten first). The node also
`remember`s its own announcements so echoes of them are ignored. It also remembers which step
each announced blob belongs to, so a fetched blob is tagged with its step (and pruned with it)
even when the caller does not say.
"""

from __future__ import annotations

import enum
import inspect
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from psyche_common.announcements import (
    Announcement,
    AnnouncementError,
    ResultAnnouncement,
    from_wire,
)
from psyche_common.protocol import short_id

from .announcements import message_id, verify_announcement
from .rate import PeerRates

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifiedAnnouncement:
    """An announcement whose signatures were checked: `sender` signed every field of it.

    Made only by `verify` (a peer's announcement) and `own` (one this client signed itself).
    What an announcement proves about itself is checked there, once; what depends on the round
    it names (is the sender a member of the epoch, the trainer of the batch, is the result the
    size the loaded model's layout implies) is the round pipeline's to check
    (`round.exchange`).
    """

    announcement: Announcement

    @classmethod
    def own(cls, announcement: Announcement) -> VerifiedAnnouncement:
        """An announcement this client made and signed (`make_*_announcement`)."""
        return cls(announcement)

    @property
    def sender(self) -> bytes:
        return self.announcement.sender_id

    @property
    def step(self) -> int:
        return self.announcement.step


def verify(announcement: Announcement) -> VerifiedAnnouncement:
    """Check both of the announcement's signatures; raises `AnnouncementError`."""
    verify_announcement(announcement)
    return VerifiedAnnouncement(announcement)


class Taken(enum.Enum):
    """What the app did with an announcement (see the module docstring)."""

    ACCEPTED = "accepted"
    """Taken: acknowledged and forwarded."""
    NOT_NOW = "not now"
    """Not taken now: forgotten, so a later copy is delivered again."""
    REFUSED = "refused"
    """Never to be taken: kept as seen, answered "rejected", not forwarded."""


Outcome = Taken | bool | None
"""A callback's answer: a `Taken`, or True / None (accepted) and False (not now)."""

AnnouncementCallback = Callable[[VerifiedAnnouncement, bytes], Awaitable[Outcome] | Outcome]
"""Gets each new announcement a peer pushed, once verified, and the peer that pushed it;
answers what became of it (`Outcome`)."""


def taken(outcome: Outcome) -> Taken:
    """The `Taken` a callback's answer stands for."""
    if isinstance(outcome, Taken):
        return outcome
    return Taken.NOT_NOW if outcome is False else Taken.ACCEPTED


MAX_COMMITMENTS_PER_BATCH = 2
"""Different commitments of one trainer for one batch that are accepted: the second proves
the equivocation; more add nothing."""


@dataclass(frozen=True)
class Receipt:
    """`"accepted"` | `"duplicate"` | `"deferred"` | `"rejected"`, why, and the announcement
    if accepted (only an accepted one is forwarded)."""

    status: str
    reason: str = ""
    announcement: Announcement | None = None


class AnnouncementInbox:
    """Checks and de-duplicates pushed announcements before the app's callback sees them."""

    def __init__(
        self,
        is_member: Callable[[bytes], bool],
        callback: AnnouncementCallback | None,
        max_seen: int,
        max_result_size: int | None = None,
        rates: PeerRates | None = None,
        clock: Callable[[], float] = time.monotonic,
        signer_rates: PeerRates | None = None,
    ) -> None:
        self._is_member = is_member
        self._rates = rates
        self._signer_rates = signer_rates
        self._clock = clock
        self.callback = callback
        self._max_seen = max_seen
        self._max_result_size = max_result_size
        self._commitments: OrderedDict[tuple[int, int, int, bytes], list[bytes]] = OrderedDict()
        """(step, batch_start, batch_end, trainer) → the commitments accepted for it."""
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._blob_steps: OrderedDict[bytes, int] = OrderedDict()

    def announced_step(self, blob_hash: bytes) -> int | None:
        """The step a result announcement gave for `blob_hash`, if one was seen."""
        return self._blob_steps.get(blob_hash)

    def forget(self, announcement: Announcement) -> None:
        """Undo `remember` and the commitment count of an announcement the app did not take."""
        self._seen.pop(message_id(announcement), None)
        if isinstance(announcement, ResultAnnouncement):
            known = self._commitments.get(_batch_key(announcement))
            if known is not None and announcement.commitment in known:
                known.remove(announcement.commitment)
                if not known:
                    del self._commitments[_batch_key(announcement)]

    def remember(self, announcement: Announcement) -> bool:
        """Record an announcement's id; False when it was already known."""
        key = message_id(announcement)
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        while len(self._seen) > self._max_seen:
            self._seen.popitem(last=False)
        if isinstance(announcement, ResultAnnouncement):
            self._blob_steps[announcement.blob_hash] = announcement.step
            while len(self._blob_steps) > self._max_seen:
                self._blob_steps.popitem(last=False)
        return True

    def _refuse_result(self, announcement: Announcement) -> str | None:
        """Why a result announcement is refused (too large; a third different commitment of
        the same trainer for the same batch), else None (and its commitment is recorded)."""
        if not isinstance(announcement, ResultAnnouncement):
            return None
        trainer = short_id(announcement.sender_id)
        if self._max_result_size is not None and announcement.size > self._max_result_size:
            return (
                f"result of {trainer} for step {announcement.step} announces "
                f"{announcement.size} bytes (max_result_size {self._max_result_size})"
            )
        key = _batch_key(announcement)
        known = self._commitments.get(key)
        if known is None:
            self._commitments[key] = [announcement.commitment]
            while len(self._commitments) > self._max_seen:
                self._commitments.popitem(last=False)
        elif announcement.commitment not in known:
            if len(known) >= MAX_COMMITMENTS_PER_BATCH:
                return (
                    f"equivocation of {trainer} for step {announcement.step} batch "
                    f"{announcement.batch_start}..{announcement.batch_end} is already proven "
                    f"({len(known)} commitments)"
                )
            known.append(announcement.commitment)
            log.warning(
                "%s signed a second commitment for step %d batch %d..%d: equivocation",
                trainer,
                announcement.step,
                announcement.batch_start,
                announcement.batch_end,
            )
        return None

    async def receive(self, from_peer: bytes, wire: Any) -> Receipt:
        """What became of one pushed announcement (accepted ones carry it, for forwarding)."""
        try:
            announcement = from_wire(wire)
        except AnnouncementError as exc:
            log.warning("rejected announcement via %s: %s", short_id(from_peer), exc)
            return Receipt("rejected", str(exc))
        key = message_id(announcement)
        if key in self._seen:  # the same signed bytes were verified when first seen
            self._seen.move_to_end(key)
            return Receipt("duplicate")
        if not self._is_member(announcement.sender_id):
            reason = f"signer {short_id(announcement.sender_id)} is not a member"
            log.warning("rejected announcement via %s: %s", short_id(from_peer), reason)
            return Receipt("rejected", reason)
        if self._rates is not None and not self._rates.allow(from_peer, self._clock()):
            log.debug("deferred announcement via %s: over its rate", short_id(from_peer))
            return Receipt(
                "deferred",
                f"over {self._rates.rate:g} new announcements per second from "
                f"{short_id(from_peer)}: will be accepted when sent again",
            )
        try:
            verified = verify(announcement)
        except AnnouncementError as exc:
            log.warning("rejected announcement via %s: %s", short_id(from_peer), exc)
            return Receipt("rejected", str(exc))
        signer = announcement.sender_id
        if self._signer_rates is not None and signer != from_peer:  # forwarded: the signer pays
            if self._rates is not None:
                self._rates.refund(from_peer)
            if not self._signer_rates.allow(signer, self._clock()):
                log.debug("deferred announcement of %s: over its signer's rate", short_id(signer))
                return Receipt(
                    "deferred",
                    f"over {self._signer_rates.rate:g} forwarded announcements per second "
                    f"signed by {short_id(signer)}: will be accepted when sent again",
                )
        refusal = self._refuse_result(announcement)
        if refusal is not None:
            log.warning("rejected announcement via %s: %s", short_id(from_peer), refusal)
            return Receipt("rejected", refusal)
        if not self.remember(announcement):
            return Receipt("duplicate")
        if self.callback is not None:
            try:
                outcome = self.callback(verified, from_peer)
                if inspect.isawaitable(outcome):
                    outcome = await outcome
            except Exception:
                log.exception("on_announcement callback failed for a %s", announcement.kind)
                outcome = None
            answer = taken(outcome)
            if answer is Taken.NOT_NOW:
                self.forget(announcement)
                return Receipt("deferred", "not taken now: will be accepted when sent again")
            if answer is Taken.REFUSED:
                return Receipt("rejected", f"{announcement.kind} not taken by this client")
        return Receipt("accepted", announcement=announcement)


def _batch_key(announcement: ResultAnnouncement) -> tuple[int, int, int, bytes]:
    return (
        announcement.step,
        announcement.batch_start,
        announcement.batch_end,
        announcement.sender_id,
    )
