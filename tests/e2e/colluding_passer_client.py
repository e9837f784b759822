"""A test-only colluding passer: a sign flipper that, as a verifier, passes its colluders'
results whatever its check found.

It is `psyche-client` with two changes: its training backend negates every gradient
(`signflip_client.SignFlipBackend`), and its uplink turns each accusation of a colluder into
an attestation of the same commitment (full agreement), so that its colluders' flipped
results, when it checks them, have a passer beside their honest accusers. It checks every
other trainer honestly. The colluders are the keys listed (hex, comma-separated) in
`PSYCHE_ATTACK_COLLUDERS`; the harness gives every attacker of the run the same list. Every
shielding pass is logged: `colluding passer: passed a colluder's failing result` (fields
`trainer`, `batch`, `step`). Run it with `psyche-client`'s arguments:
`python tests/e2e/colluding_passer_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.session.uplink import SwitchableUplink
from psyche_client.weights.backends import with_distro_backend
from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id

from tests.e2e.signflip_client import SignFlipBackend

log = logging.getLogger("psyche.client")

FULL_AGREEMENT = 1000


def colluders() -> frozenset[bytes]:
    listed = os.environ.get("PSYCHE_ATTACK_COLLUDERS", "")
    return frozenset(bytes.fromhex(key) for key in listed.split(",") if key)


class PassingUplink(SwitchableUplink):
    """Attests, instead of accusing, the results of `colluders`."""

    def __init__(self, shielded: frozenset[bytes]) -> None:
        super().__init__()
        self.shielded = shielded

    async def send_accusation(
        self,
        step: int,
        trainer: bytes,
        batch: BatchId,
        agreement_milli: int,
        commitment: bytes | None = None,
    ) -> None:
        if trainer not in self.shielded:
            await super().send_accusation(step, trainer, batch, agreement_milli, commitment)
            return
        if commitment is None:
            return  # nothing to pass: stay silent
        log.info(
            "colluding passer: passed a colluder's failing result",
            extra={"trainer": short_id(trainer), "batch": str(batch), "step": step},
        )
        await self.send_attestation(step, trainer, batch, FULL_AGREEMENT, commitment)


def main() -> None:
    from psyche_client.cli import main as client_main

    shielded = colluders()
    client_main(
        obj=Parts(
            uplink=lambda: PassingUplink(shielded),
            backends=with_distro_backend(SignFlipBackend),
        )
    )


if __name__ == "__main__":
    main()
