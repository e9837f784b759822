"""A test-only client on a slower machine: `psyche-client` whose DisTrO backend takes
`PSYCHE_TEST_SECONDS_PER_SAMPLE` seconds (default 0.3) more per sample of every batch it
trains, as a weaker device would. It trains the real model and sends honest results; only its
speed differs. Run it with `psyche-client`'s arguments: `python tests/e2e/slow_trainer_client.py
train --server-addr ...`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.training.backend import Samples, TrainedResult
from psyche_client.training.distro_backend import DistroBackend
from psyche_client.weights.backends import with_distro_backend
from psyche_common.batch_id import BatchId

SECONDS_PER_SAMPLE = float(os.environ.get("PSYCHE_TEST_SECONDS_PER_SAMPLE", "0.3"))


class SlowBackend(DistroBackend):
    """The DisTrO backend, slower by a fixed time per sample."""

    def train(
        self, step: int, batch: BatchId, samples: Samples | None, cancelled: Callable[[], bool]
    ) -> TrainedResult | None:
        time.sleep(SECONDS_PER_SAMPLE * (batch.end - batch.start + 1))
        return super().train(step, batch, samples, cancelled)


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(backends=with_distro_backend(SlowBackend)))


if __name__ == "__main__":
    main()
