"""A test-only selective cheat: it negates its gradients only for the batches it predicts no
verifier will check.

It is `psyche-client` with two changes: its uplink taps the public states
(`public_view.TappingUplink`), and its training backend is `signflip_client.SignFlipBackend`,
negating a batch's gradients only when the cheat predicts the batch unchecked. It predicts as
well as anyone can before the round's results are committed: it runs the verifiers' own
sampling rule (`verifier_sample`, their groups included) on the round's public seed, the only
seed it knows when it trains (the real sample seed stays hidden until RoundWitness; a protocol
that drew the sample from the public seed would be beaten by exactly this). Each decision is
logged: `selective cheat: negating a batch predicted unchecked`, `selective cheat: training
honestly a batch predicted checked` or `... a batch of a round it has not seen` (fields `step`,
`batch`). Run it with `psyche-client`'s
arguments: `python tests/e2e/selective_cheat_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.training.backend import Samples, TrainedResult
from psyche_client.training.distro_backend import DistroBackend
from psyche_client.weights.backends import with_distro_backend
from psyche_common.batch_id import BatchId

from tests.e2e.public_view import PublicView, TappingUplink
from tests.e2e.signflip_client import SignFlipBackend

log = logging.getLogger("psyche.client")


def predicted_checked(view: PublicView, step: int, batch: BatchId) -> bool:
    """Whether the sampling rule run on the round's public seed puts `batch` in a
    verifier's sample (a round the view has not seen counts as checked: no cheating blind)."""
    roles = view.roles(step)
    if roles is None:
        return True
    public_seed = roles.random_seed.to_bytes(8, "little")
    checkers = view.checkers(step, batch, seed=public_seed)
    return checkers is None or bool(checkers)


class SelectiveCheatBackend(SignFlipBackend):
    """Negates the gradients of the batches `predicted_checked` says go unchecked."""

    view: ClassVar[PublicView]

    def train(
        self, step: int, batch: BatchId, samples: Samples | None, cancelled: Callable[[], bool]
    ) -> TrainedResult | None:
        if self.view.roles(step) is None:
            log.info(
                "selective cheat: training honestly a batch of a round it has not seen",
                extra={"step": step, "batch": str(batch)},
            )
            return DistroBackend.train(self, step, batch, samples, cancelled)
        if predicted_checked(self.view, step, batch):
            log.info(
                "selective cheat: training honestly a batch predicted checked",
                extra={"step": step, "batch": str(batch)},
            )
            return DistroBackend.train(self, step, batch, samples, cancelled)
        log.info(
            "selective cheat: negating a batch predicted unchecked",
            extra={"step": step, "batch": str(batch)},
        )
        return super().train(step, batch, samples, cancelled)


def main() -> None:
    from psyche_client.cli import main as client_main

    view = PublicView()
    SelectiveCheatBackend.view = view
    client_main(
        obj=Parts(
            uplink=lambda: TappingUplink(view),
            backends=with_distro_backend(SelectiveCheatBackend),
        )
    )


if __name__ == "__main__":
    main()
