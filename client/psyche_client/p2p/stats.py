"""Byte and download counters of one P2P node, per training step and per peer.

The client app calls `set_step(step)` when a round starts; every byte the node writes or reads
on a peer connection (frame headers included) is attributed to the current step and to that
peer. The dashboard shows `current()` (this step's up/down bytes) and `totals()`.
Only the last `keep_steps` steps are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Traffic:
    """Bytes sent and received: during one step, or with one peer."""

    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass
class DownloadCounters:
    """Blob download outcomes (a download may try several peers)."""

    started: int = 0
    finished: int = 0
    failed: int = 0
    corrupt: int = 0
    attempts_failed: int = 0


@dataclass
class TransferStats:
    """Traffic per step (the last `keep_steps`), per peer and in total; download outcomes."""

    keep_steps: int = 64
    step: int = 0
    _steps: OrderedDict[int, Traffic] = field(default_factory=OrderedDict)
    peers: dict[bytes, Traffic] = field(default_factory=dict)
    downloads: DownloadCounters = field(default_factory=DownloadCounters)
    total_sent: int = 0
    total_received: int = 0

    def set_step(self, step: int) -> None:
        """Attribute subsequent traffic to `step`."""
        self.step = step
        self._traffic(step)

    def _traffic(self, step: int) -> Traffic:
        traffic = self._steps.get(step)
        if traffic is None:
            traffic = self._steps[step] = Traffic()
            while len(self._steps) > self.keep_steps:
                self._steps.popitem(last=False)
        return traffic

    def record_sent(self, peer_id: bytes | None, count: int) -> None:
        self._traffic(self.step).bytes_sent += count
        self.total_sent += count
        if peer_id is not None:
            self.peers.setdefault(peer_id, Traffic()).bytes_sent += count

    def record_received(self, peer_id: bytes | None, count: int) -> None:
        self._traffic(self.step).bytes_received += count
        self.total_received += count
        if peer_id is not None:
            self.peers.setdefault(peer_id, Traffic()).bytes_received += count

    def for_step(self, step: int) -> Traffic:
        """Traffic recorded at `step` (zeros when none or already forgotten)."""
        return self._steps.get(step, Traffic())

    def current(self) -> Traffic:
        return self.for_step(self.step)

    def steps(self) -> dict[int, Traffic]:
        return dict(self._steps)
