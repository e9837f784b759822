"""A test-only copier: it announces another trainer's result as its own.

It is `psyche-client` with one change, its training backend (`Parts(backends=...)`): once it
has trained one of its batches it waits (up to `COPY_WAIT` seconds) for a verified result of
another batch of the same step (every peer result passes through its `decode`), relabels that
result's values and indices with its own step, batch and nonce (so the strict decode and the
signed commitment check pass: the commitment covers the step and the batch), and publishes that
instead of its own. It still trains, so its timing looks ordinary; it only throws its own work
away. Every copy is logged as `copier: copied a result` (fields `step`, `batch`,
`copied_batch`). When no peer result arrives in time it publishes its own. Run it with
`psyche-client`'s arguments: `python tests/e2e/copier_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.distro.result import DistroResult
from psyche_client.training.backend import Samples, TrainedResult
from psyche_client.weights.backends import with_distro_backend
from psyche_common.batch_id import BatchId

from tests.e2e.rewriting_backend import RewritingBackend, relabelled

COPY_WAIT = 10.0

log = logging.getLogger("psyche.client")


class CopierBackend(RewritingBackend):
    """The DisTrO backend, publishing a peer's result of the same step as its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()  # `decode` runs in other worker threads than `train`
        self._mine: set[tuple[int, BatchId]] = set()
        self._peers: dict[int, tuple[BatchId, DistroResult]] = {}
        """Step → the first verified result of a batch not ours."""

    def decode(self, step: int, batch: BatchId, payload: bytes, data_hash: bytes) -> DistroResult:
        result = super().decode(step, batch, payload, data_hash)
        with self._lock:
            if (step, batch) not in self._mine:
                self._peers.setdefault(step, (batch, result))
        return result

    def _peer_result(self, step: int) -> tuple[BatchId, DistroResult] | None:
        with self._lock:
            return self._peers.get(step)

    def train(
        self, step: int, batch: BatchId, samples: Samples | None, cancelled: Callable[[], bool]
    ) -> TrainedResult | None:
        with self._lock:
            self._mine.add((step, batch))
            self._mine = {(s, b) for s, b in self._mine if s >= step - 2}
            self._peers = {s: found for s, found in self._peers.items() if s >= step - 2}
        return super().train(step, batch, samples, cancelled)

    def rewrite(self, mine: DistroResult, cancelled: Callable[[], bool]) -> DistroResult:
        deadline = time.monotonic() + COPY_WAIT
        found = self._peer_result(mine.step)
        while found is None and time.monotonic() < deadline and not cancelled():
            time.sleep(0.05)
            found = self._peer_result(mine.step)
        if found is None:
            return mine
        copied_batch, copied = found
        log.info(
            "copier: copied a result",
            extra={
                "step": mine.step,
                "batch": str(mine.batch_id),
                "copied_batch": str(copied_batch),
            },
        )
        return relabelled(copied, mine)


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(backends=with_distro_backend(CopierBackend)))


if __name__ == "__main__":
    main()
