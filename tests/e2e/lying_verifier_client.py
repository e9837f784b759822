"""A test-only lying verifier: every result it checks as a verifier it reports as failed.

It is `psyche-client` with one change, in its uplink (`Parts(uplink=...)`): each attestation
(a result that passed its checks) goes out as an accusation instead, with agreement 0, naming
the same commitment; so every result it checks is accused. It trains, witnesses and serves
honestly. Every lie is logged as `lying verifier: accused a passing result` (fields
`trainer`, `batch`). Run it with `psyche-client`'s arguments:
`python tests/e2e/lying_verifier_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.session.uplink import SwitchableUplink
from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id

log = logging.getLogger("psyche.client")


class LyingVerifierUplink(SwitchableUplink):
    """Turns every attestation into an accusation of the same result."""

    async def send_attestation(
        self, step: int, trainer: bytes, batch: BatchId, agreement_milli: int, commitment: bytes
    ) -> None:
        log.info(
            "lying verifier: accused a passing result",
            extra={"trainer": short_id(trainer), "batch": str(batch), "step": step},
        )
        await self.send_accusation(step, trainer, batch, 0, commitment)


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(uplink=LyingVerifierUplink))


if __name__ == "__main__":
    main()
