"""The announcements of the last few steps, for peers whose link comes up late.

A client behind NAT is reachable only once it has dialed its peers, and any link can drop and
come back; announcements pushed (or forwarded) while a peer had no link to us never reached
it, and gossip forwards each announcement only once. So when a link to a peer comes up, the
node pushes it the announcements it holds for recent steps (its own and every one it
accepted); the peer answers `duplicate` for those it already has. Bounded by step (pruned with
the blobs, `forget_before`) and by count (oldest first).
"""

from __future__ import annotations

from collections import OrderedDict

from psyche_common.announcements import Announcement

from .announcements import message_id

MAX_RECENT = 4096


class RecentAnnouncements:
    """Announcements by message id, oldest first, each with its step."""

    def __init__(self, max_count: int = MAX_RECENT) -> None:
        self._max = max_count
        self._items: OrderedDict[bytes, Announcement] = OrderedDict()

    def add(self, announcement: Announcement) -> None:
        self._items[message_id(announcement)] = announcement
        self._items.move_to_end(message_id(announcement))
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def prune_before(self, step: int) -> None:
        """Forget announcements of steps before `step`."""
        for key in [k for k, a in self._items.items() if a.step < step]:
            del self._items[key]

    def all(self) -> list[Announcement]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
