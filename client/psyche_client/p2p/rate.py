"""Per-peer rate of new announcements (`PeerRates`): a token bucket per pushing peer.

Verifying an announcement costs two ed25519 signature checks, so the inbox charges each
announcement that reaches them (one that is new: duplicates are dropped before, on a hash) to
the peer that pushed it. A peer may push `burst` new announcements at once and `rate` per
second after that; over it, its announcements are answered "deferred" (not seen, not
forwarded), so a flooding member costs each peer at most `rate` verifications per second,
while an honest peer's rare overflow (a catch-up after a link came up) is delivered again by
gossip or by its trainer's re-announcement.

`FrameRate` is one link's budget of frames read: how long to wait before reading the next one,
so the frames a link's peer sends are paced before they are decrypted or decoded.

Pure logic: the caller passes the clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

MAX_TRACKED_PEERS = 4096
"""Peers whose bucket is kept (least recently charged forgotten first: a forgotten peer
starts again with a full bucket, which costs at most one burst)."""


@dataclass
class _Bucket:
    tokens: float
    updated: float


class PeerRates:
    """Token buckets of `rate` per second and `burst` capacity, one per peer."""

    def __init__(self, rate: float, burst: int, max_peers: int = MAX_TRACKED_PEERS) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"PeerRates needs rate > 0 and burst >= 1, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._max_peers = max_peers
        self._buckets: OrderedDict[bytes, _Bucket] = OrderedDict()

    def allow(self, peer: bytes, now: float) -> bool:
        """Charge one announcement to `peer` at time `now`; False when it is over its rate."""
        bucket = self._buckets.get(peer)
        if bucket is None:
            bucket = _Bucket(float(self.burst), now)
            self._buckets[peer] = bucket
            while len(self._buckets) > self._max_peers:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(peer)
            elapsed = max(0.0, now - bucket.updated)
            bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.rate)
            bucket.updated = now
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def refund(self, peer: bytes) -> None:
        """Give back one charge of `peer` (capped at its burst): it turned out to be owed by
        someone else."""
        bucket = self._buckets.get(peer)
        if bucket is not None:
            bucket.tokens = min(float(self.burst), bucket.tokens + 1.0)


class FrameRate:
    """A token bucket of `rate` frames per second and `burst` capacity for one link."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"FrameRate needs rate > 0 and burst >= 1, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._bucket = _Bucket(float(burst), now)

    def delay(self, now: float) -> float:
        """Charge one frame at time `now`; the seconds to wait before reading it (0 within
        the budget). The charge is taken either way: the wait repays it."""
        bucket = self._bucket
        elapsed = max(0.0, now - bucket.updated)
        bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.rate) - 1.0
        bucket.updated = now
        return 0.0 if bucket.tokens >= 0.0 else -bucket.tokens / self.rate
