"""A test-only free rider: it announces another trainer's result as its own.

It is `psyche-client` with one change: when it publishes the result of one of its batches it
waits (up to `COPY_WAIT` seconds) for a verified result of another trainer of the same
round, relabels that result's values and indices with its own step, batch and nonce (so the
strict decode and the signed commitment check pass: the commitment covers the step and the
batch), and publishes that instead of its own. It still trains, so its timing looks ordinary;
it only throws its own work away. Every copy is logged as `free rider: copied a result`
(fields `copied_from`, `batch`). When no peer result arrives in time it publishes its own.
Run it with `psyche-client`'s arguments:
`python tests/e2e/freerider_client.py train --server-addr ...`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.distro.result import DistroResult
from psyche_client.round.exchange import ResultExchange
from psyche_client.round.state import DownloadStatus, RoundState
from psyche_client.training.backend import TrainedResult
from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id

COPY_WAIT = 10.0
honest_publish = ResultExchange.publish

log = logging.getLogger("psyche.client")


def peer_result(exchange: ResultExchange, round_: RoundState) -> tuple[bytes, DistroResult] | None:
    """A verified DisTrO result of another trainer of `round_`, if one has arrived."""
    for download in round_.downloads.values():
        sender = download.announcement.sender_id
        if (
            sender != exchange.ctx.me
            and download.status == DownloadStatus.VERIFIED
            and isinstance(download.result, DistroResult)
        ):
            return sender, download.result
    return None


async def publish_a_copy(
    self: ResultExchange, round_: RoundState, batch: BatchId, output: TrainedResult
) -> None:
    deadline = time.monotonic() + COPY_WAIT
    found = peer_result(self, round_)
    while found is None and time.monotonic() < deadline and not round_.cancelled:
        await asyncio.sleep(0.05)
        found = peer_result(self, round_)
    if found is not None:
        sender, copied = found
        backend: Any = self.ctx.require_backend()  # a DistroBackend: it trains DisTrO
        mine = DistroResult.decode(output.payload, backend.trainer.layout)
        relabelled = DistroResult(
            round_.step, batch, mine.trainer_nonce, copied.value_kind, copied.tensors
        )
        output = TrainedResult(
            loss=output.loss,
            payload=relabelled.encode(),
            data_hash=relabelled.data_hash(),
            tokens=output.tokens,
        )
        log.info(
            "free rider: copied a result",
            extra=self.ctx.fields(copied_from=short_id(sender), batch=str(batch)),
        )
    await honest_publish(self, round_, batch, output)


def main() -> None:
    ResultExchange.publish = publish_a_copy  # type: ignore[method-assign]
    from psyche_client.cli import main as client_main

    client_main()


if __name__ == "__main__":
    main()
