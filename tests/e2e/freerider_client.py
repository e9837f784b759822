"""A test-only free rider: it trains once, then re-sends that old result for every later batch.

It is `psyche-client` with one change: the first result it trains is kept, and every later
result it publishes is that one relabelled with the new step, batch and nonce (so the strict
decode and the signed commitment check pass). It still trains, so its timing looks ordinary;
it only throws the new work away: its updates follow data it saw once, not the batches it is
assigned (a "lazy" trainer; the copier of tests/e2e/copier_client.py sends another trainer's
work instead). Every stale result is logged as `free rider: sent a stale result` (field
`batch`). Run it with `psyche-client`'s arguments:
`python tests/e2e/freerider_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.distro.result import DistroResult
from psyche_client.round.context import RoundContext
from psyche_client.round.state import RoundState
from psyche_client.training.backend import TrainedResult
from psyche_client.training.distro_backend import DistroBackend
from psyche_common.batch_id import BatchId

log = logging.getLogger("psyche.client")


class StaleResults:
    """A `PublishHook` that keeps the first result and re-sends it for every later batch."""

    def __init__(self) -> None:
        self.kept: DistroResult | None = None

    async def __call__(
        self, ctx: RoundContext, round_: RoundState, batch: BatchId, output: TrainedResult
    ) -> TrainedResult:
        backend = ctx.require_backend()
        if not isinstance(backend, DistroBackend):
            raise SystemExit("freerider_client needs a DisTrO run on one device")
        mine = DistroResult.decode(output.payload, backend.trainer.layout)
        if self.kept is None:
            self.kept = mine
            return output
        stale = DistroResult(
            round_.step, batch, mine.trainer_nonce, self.kept.value_kind, self.kept.tensors
        )
        log.info("free rider: sent a stale result", extra=ctx.fields(batch=str(batch)))
        return TrainedResult(
            loss=output.loss,
            payload=stale.encode(),
            data_hash=stale.data_hash(),
            tokens=output.tokens,
        )


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(before_publish=StaleResults()))


if __name__ == "__main__":
    main()
