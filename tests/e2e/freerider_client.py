"""A test-only free rider: it trains once, then re-sends that old result for every later batch.

It is `psyche-client` with one change, its training backend (`Parts(backends=...)`): the first
result it trains is kept, and every later result it publishes is that one relabelled with the
new step, batch and nonce (so the strict decode and the signed commitment check pass). It still
trains, so its timing looks ordinary; it only throws the new work away: its updates follow data
it saw once, not the batches it is assigned (a "lazy" trainer; the copier of
tests/e2e/copier_client.py sends another trainer's work instead). Every stale result is logged
as `free rider: sent a stale result` (fields `step`, `batch`). Run it with `psyche-client`'s
arguments: `python tests/e2e/freerider_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.distro.result import DistroResult
from psyche_client.weights.backends import with_distro_backend

from tests.e2e.rewriting_backend import RewritingBackend, relabelled

log = logging.getLogger("psyche.client")


class StaleResultsBackend(RewritingBackend):
    """The DisTrO backend, publishing its first result again for every later batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: DistroResult | None = None

    def rewrite(self, mine: DistroResult, cancelled: Callable[[], bool]) -> DistroResult:
        if self.kept is None:
            self.kept = mine
            return mine
        log.info(
            "free rider: sent a stale result",
            extra={"step": mine.step, "batch": str(mine.batch_id)},
        )
        return relabelled(self.kept, mine)


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(backends=with_distro_backend(StaleResultsBackend)))


if __name__ == "__main__":
    main()
