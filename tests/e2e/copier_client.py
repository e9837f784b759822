"""A test-only copier: it announces another trainer's result as its own.

It is `psyche-client` with one change: when it publishes the result of one of its batches it
waits (up to `COPY_WAIT` seconds) for a verified result of another trainer of the same
round, relabels that result's values and indices with its own step, batch and nonce (so the
strict decode and the signed commitment check pass: the commitment covers the step and the
batch), and publishes that instead of its own. It still trains, so its timing looks ordinary;
it only throws its own work away. Every copy is logged as `copier: copied a result`
(fields `copied_from`, `batch`). When no peer result arrives in time it publishes its own.
Run it with `psyche-client`'s arguments:
`python tests/e2e/copier_client.py train --server-addr ...`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.distro.result import DistroResult
from psyche_client.round.context import RoundContext
from psyche_client.round.state import DownloadStatus, RoundState
from psyche_client.training.backend import TrainedResult
from psyche_client.training.distro_backend import DistroBackend
from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id

COPY_WAIT = 10.0

log = logging.getLogger("psyche.client")


def peer_result(ctx: RoundContext, round_: RoundState) -> tuple[bytes, DistroResult] | None:
    """A verified DisTrO result of another trainer of `round_`, if one has arrived."""
    for download in round_.downloads.values():
        sender = download.announcement.sender_id
        if (
            sender != ctx.me
            and download.status == DownloadStatus.VERIFIED
            and isinstance(download.result, DistroResult)
        ):
            return sender, download.result
    return None


async def copy_a_peer_result(
    ctx: RoundContext, round_: RoundState, batch: BatchId, output: TrainedResult
) -> TrainedResult:
    """A `PublishHook`: a peer's result relabelled as ours, or ours when none came in time."""
    deadline = time.monotonic() + COPY_WAIT
    found = peer_result(ctx, round_)
    while found is None and time.monotonic() < deadline and not round_.cancelled:
        await asyncio.sleep(0.05)
        found = peer_result(ctx, round_)
    if found is None:
        return output
    sender, copied = found
    backend = ctx.require_backend()
    if not isinstance(backend, DistroBackend):
        raise SystemExit("copier_client needs a DisTrO run on one device (the distro backend)")
    mine = DistroResult.decode(output.payload, backend.trainer.layout)
    relabelled = DistroResult(
        round_.step, batch, mine.trainer_nonce, copied.value_kind, copied.tensors
    )
    log.info(
        "copier: copied a result",
        extra=ctx.fields(copied_from=short_id(sender), batch=str(batch)),
    )
    return TrainedResult(
        loss=output.loss,
        payload=relabelled.encode(),
        data_hash=relabelled.data_hash(),
        tokens=output.tokens,
    )


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(before_publish=copy_a_peer_result))


if __name__ == "__main__":
    main()
