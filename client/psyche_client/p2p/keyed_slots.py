"""`KeyedSlots`: at most N holders at once per key (a peer, a peer and a kind of request), so
one peer's slow work cannot take every shared slot. An entry lives while any holder holds or
waits for one of its slots: the table stays as small as the keys in use."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class _Slots:
    def __init__(self, slots: int) -> None:
        self.semaphore = asyncio.Semaphore(slots)
        self.users = 0


class KeyedSlots(Generic[K]):
    """`slot(key)`: one of `per_key` slots of `key` (waits while they are all held)."""

    def __init__(self, per_key: int) -> None:
        if per_key < 1:
            raise ValueError(f"KeyedSlots needs at least one slot per key, got {per_key}")
        self.per_key = per_key
        self._slots: dict[K, _Slots] = {}

    @contextlib.asynccontextmanager
    async def slot(self, key: K) -> AsyncIterator[None]:
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = _Slots(self.per_key)
        slots.users += 1
        try:
            async with slots.semaphore:
                yield
        finally:
            slots.users -= 1
            if slots.users == 0:
                del self._slots[key]

    def users(self, key: K) -> int:
        """Holders and waiters of `key` now."""
        slots = self._slots.get(key)
        return slots.users if slots is not None else 0
