"""Announcements for rounds this client has not started yet, within bounds (`EarlyAnnouncements`).

A peer may start a round (and announce for it) a little before this client does. Such
announcements are kept and replayed when the round starts, but only for the next
`EARLY_STEPS` steps after the latest coordinator state's step, at most `EARLY_PER_SENDER` per
sender, and all are forgotten when the epoch changes: one member's flood of far-future
announcements cannot fill the list and crowd out its peers'. What is not kept is the caller's
to refuse ("not now"), so the P2P inbox forgets it and a later copy is taken.
"""

from __future__ import annotations

from collections import Counter

from psyche_common.announcements import Announcement, FinishedAnnouncement
from psyche_common.coordinator import Coordinator

from psyche_client.p2p.inbox import VerifiedAnnouncement

EARLY_STEPS = 2
"""Announcements are kept early for at most this many steps after the coordinator's step."""
EARLY_PER_SENDER = 8
"""Early announcements kept per sender (an honest one sends a result and a Finished per
step)."""


class EarlyAnnouncements:
    """The kept announcements, in arrival order, and the epoch they were kept in."""

    def __init__(self) -> None:
        self.kept: list[VerifiedAnnouncement] = []
        self._epoch: int | None = None

    def keep(self, verified: VerifiedAnnouncement, coordinator: Coordinator) -> bool:
        """Keep `verified` if it is for one of the next `EARLY_STEPS` steps of `coordinator`
        and its sender is within its quota; False when it is not kept."""
        self.follow_epoch(coordinator)
        if verified.step > coordinator.progress.step + EARLY_STEPS:
            return False
        if self.by_sender()[verified.sender] >= EARLY_PER_SENDER:
            return False
        self.kept.append(verified)
        return True

    def follow_epoch(self, coordinator: Coordinator | None) -> None:
        """Forget everything kept when the coordinator's epoch is not the one it was kept in."""
        epoch = coordinator.progress.epoch if coordinator is not None else None
        if epoch != self._epoch:
            self.kept.clear()
            self._epoch = epoch

    def take(self, coordinator: Coordinator | None) -> list[VerifiedAnnouncement]:
        """Everything kept in this epoch, emptying the list (to be routed again)."""
        self.follow_epoch(coordinator)
        taken, self.kept = self.kept, []
        return taken

    def holds_finished(self, announcement: Announcement) -> bool:
        """Whether `announcement` is a Finished and one of its sender for its step is kept
        (one Finished per sender and step is taken)."""
        return isinstance(announcement, FinishedAnnouncement) and any(
            isinstance(kept.announcement, FinishedAnnouncement)
            and kept.sender == announcement.sender_id
            and kept.step == announcement.step
            for kept in self.kept
        )

    def by_sender(self) -> Counter[bytes]:
        """How many announcements each sender has kept."""
        return Counter(kept.sender for kept in self.kept)
