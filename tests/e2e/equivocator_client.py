"""A test-only equivocator: it signs two different results for each of its batches and tells
each half of the other members a different one.

It is `psyche-client` with one change, in its network part (`Parts(network=...)`): when it
announces one of its results (A), it also makes a second one (B) of the same step and batch,
publishes B's blob, signs B, and pushes A to the first half of the other members (by id) and
B to the second half. B is A's blob with another trainer nonce in its header for a DisTrO
result (the same data hash, another blob: docs/security.md finding 3), or, for the dummy
backend, A's payload with one byte changed and its commitment recomputed (another data hash:
finding 2). Both are valid results that decode; each half sees one signed commitment. Every
pair is logged as `equivocator: announced two commitments`. Run it with `psyche-client`'s
arguments: `python tests/e2e/equivocator_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import NodeNetwork, Parts
from psyche_client.distro.result import MAGIC
from psyche_client.p2p.announcements import (
    FinishedAnnouncement,
    ResultAnnouncement,
    make_result_announcement,
)
from psyche_client.training.backend import result_commitment
from psyche_common.batch_id import BatchId

log = logging.getLogger("psyche.client")

NONCE_OFFSET = 10
"""Where the trainer nonce (u32) sits in an encoded DisTrO result: magic 4, version 1,
value kind 1, step 4."""


def other_result(announcement: ResultAnnouncement, payload: bytes) -> tuple[bytes, bytes]:
    """A second valid payload for the same step and batch, and its data hash."""
    if payload.startswith(MAGIC):
        (nonce,) = struct.unpack_from(">I", payload, NONCE_OFFSET)
        other = bytearray(payload)
        struct.pack_into(">I", other, NONCE_OFFSET, (nonce + 1) % 2**32)
        return bytes(other), announcement.data_hash
    other = bytes([payload[0] ^ 0xFF]) + payload[1:]
    batch = BatchId(announcement.batch_start, announcement.batch_end)
    return other, result_commitment(announcement.step, batch, other)


class EquivocatingNetwork(NodeNetwork):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.payloads: dict[bytes, bytes] = {}
        self.seconds: dict[bytes, ResultAnnouncement] = {}

    def publish_blob(self, data: bytes, step: int) -> bytes:
        blob_hash = super().publish_blob(data, step)
        self.payloads[blob_hash] = data
        return blob_hash

    async def announce(self, announcement: ResultAnnouncement | FinishedAnnouncement) -> None:
        payload = (
            self.payloads.get(announcement.blob_hash)
            if isinstance(announcement, ResultAnnouncement)
            else None
        )
        if not isinstance(announcement, ResultAnnouncement) or payload is None:
            await super().announce(announcement)
            return
        second = self.seconds.get(announcement.blob_hash)
        if second is None:
            data, data_hash = other_result(announcement, payload)
            second = make_result_announcement(
                self.node.identity,
                run_id=announcement.run_id,
                round_seed=announcement.round_seed,
                step=announcement.step,
                batch_start=announcement.batch_start,
                batch_end=announcement.batch_end,
                data_hash=data_hash,
                blob_hash=self.node.publish_blob(data, step=announcement.step),
                size=len(data),
            )
            self.seconds[announcement.blob_hash] = second
            log.info(
                "equivocator: announced two commitments",
                extra={"step": announcement.step, "batch": announcement.batch_start},
            )
        others = sorted(peer for peer in self.node.known_peers() if peer != self.node.peer_id)
        half = len(others) // 2
        await self.node.announce(announcement, others[:half])
        await self.node.announce(second, others[half:])


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(network=EquivocatingNetwork))


if __name__ == "__main__":
    main()
