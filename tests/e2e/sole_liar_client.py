"""A test-only sole liar: as a verifier it accuses exactly the batches no other verifier
checks, and passes the rest honestly.

It is `psyche-client` with one change: its uplink taps the public states
(`public_view.TappingUplink`) and, for each result it would attest, works out from the
round's revealed sample seed who else checks that batch (`PublicView.checkers`); when nobody
else does, it sends an accusation of the same commitment instead (agreement 0), the lie that
no co-checker can contradict. It trains, witnesses and serves honestly. Every lie is logged:
`sole liar: accused a batch only it checks` (fields `trainer`, `batch`, `step`). Run it with
`psyche-client`'s arguments: `python tests/e2e/sole_liar_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id

from tests.e2e.public_view import PublicView, TappingUplink

log = logging.getLogger("psyche.client")


class SoleLiarUplink(TappingUplink):
    """Accuses the passing results of the batches only this verifier checks."""

    async def send_attestation(
        self, step: int, trainer: bytes, batch: BatchId, agreement_milli: int, commitment: bytes
    ) -> None:
        checkers = self.view.checkers(step, batch)
        if checkers is not None and len(checkers) == 1:
            log.info(
                "sole liar: accused a batch only it checks",
                extra={"trainer": short_id(trainer), "batch": str(batch), "step": step},
            )
            await self.send_accusation(step, trainer, batch, 0, commitment)
            return
        await super().send_attestation(step, trainer, batch, agreement_milli, commitment)


def main() -> None:
    from psyche_client.cli import main as client_main

    view = PublicView()
    client_main(obj=Parts(uplink=lambda: SoleLiarUplink(view)))


if __name__ == "__main__":
    main()
