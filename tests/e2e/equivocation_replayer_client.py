"""A test-only equivocation replayer: a member that reports, as equivocations, pairs of
commitments honest keys signed somewhere else.

It is `psyche-client` with one addition, in its uplink (`public_view.TappingUplink`): at every
new training round, for each honest key it holds (the key files named, comma-separated, by
`PSYCHE_ATTACK_HONEST_KEYS`: the harness hands them over to stand in for what the attacker
recorded), it sends the server one `Equivocation` of each kind of `KINDS`, two commitments of
that key for the same step and batch with different data:

- `another run`: signed for another run id, the round's step, seed and batch;
- `an earlier life`: this run and step, but another round seed (a restored state draws new
  seeds, so an honest key signs the same step and batch again after a restore);
- `a closed step`: this run, a step three rounds back with that round's own seed and batch;
- `an unassigned batch`: this round's step and seed, a batch another trainer had.

The first two are pairs an honest key really signs; the last two no honest key signs, and test
the bounds the coordinator puts on a proof even with signatures that verify. It trains,
witnesses and serves honestly. Each proof is logged: `equivocation replayer: sent a replayed
proof` (fields `kind`, `trainer`, `step`). Run it with `psyche-client`'s arguments:
`PSYCHE_ATTACK_HONEST_KEYS=K1,K2 python tests/e2e/equivocation_replayer_client.py train ...`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_common.announcements import ResultCommitment
from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.coordinator.types import RunState
from psyche_common.protocol import Identity

from tests.e2e.public_view import PublicView, TappingUplink

log = logging.getLogger("psyche.client")

KINDS = ("another run", "an earlier life", "a closed step", "an unassigned batch")
CLOSED_BACK = 3
"""How many steps back `a closed step` reaches."""


def signed(
    key: Identity, run_id: str, seed: int, step: int, batch: BatchId, data: bytes
) -> ResultCommitment:
    data_hash = hashlib.sha256(data).digest()
    unsigned = ResultCommitment(
        run_id, seed, key.public_key, step, batch, data_hash, data_hash, 1024, b""
    )
    return ResultCommitment(
        run_id,
        seed,
        key.public_key,
        step,
        batch,
        data_hash,
        data_hash,
        1024,
        key.sign(unsigned.statement()),
    )


def pair(key: Identity, run_id: str, seed: int, step: int, batch: BatchId) -> EquivocationProof:
    """Two commitments of `key` for one step and batch, with different data."""
    return EquivocationProof(
        signed(key, run_id, seed, step, batch, b"first"),
        signed(key, run_id, seed, step, batch, b"second"),
    )


class ReplayingUplink(TappingUplink):
    def __init__(self, view: PublicView, honest: list[Identity]) -> None:
        super().__init__(view, self._on_update)
        self.honest = honest
        self.replayed: set[int] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def _on_update(self, coordinator: Coordinator) -> None:
        step = coordinator.progress.step
        if coordinator.run_state != RunState.RoundTrain or step in self.replayed:
            return
        self.replayed.add(step)
        for key in self.honest:
            for kind, proof in self._proofs(coordinator, key):
                task = asyncio.get_running_loop().create_task(self._send(kind, proof))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    def _proofs(
        self, coordinator: Coordinator, key: Identity
    ) -> list[tuple[str, EquivocationProof]]:
        step = coordinator.progress.step
        roles = self.view.roles(step)
        if roles is None or not roles.batch_ids:
            return []
        run_id = coordinator.run_id
        seed = roles.random_seed
        mine = [b for b, owner in roles.assignments.items() if owner == key.public_key]
        others = [b for b, owner in roles.assignments.items() if owner != key.public_key]
        batch = mine[0] if mine else roles.batch_ids[0]
        proofs = [
            ("another run", pair(key, f"{run_id}-previous", seed, step, batch)),
            ("an earlier life", pair(key, run_id, (seed + 1) % 2**64, step, batch)),
        ]
        if others:
            proofs.append(("an unassigned batch", pair(key, run_id, seed, step, others[0])))
        old = self.view.roles(step - CLOSED_BACK)
        if old is not None:
            old_mine = [b for b, owner in old.assignments.items() if owner == key.public_key]
            if old_mine:
                proof = pair(key, run_id, old.random_seed, step - CLOSED_BACK, old_mine[0])
                proofs.append(("a closed step", proof))
        return proofs

    async def _send(self, kind: str, proof: EquivocationProof) -> None:
        log.info(
            "equivocation replayer: sent a replayed proof",
            extra={"kind": kind, "trainer": short_id(proof.trainer), "step": proof.first.step},
        )
        await self.send_equivocation(proof)


def main() -> None:
    from psyche_client.cli import main as client_main

    paths = [p for p in os.environ.get("PSYCHE_ATTACK_HONEST_KEYS", "").split(",") if p]
    honest = [Identity.load(path) for path in paths]
    view = PublicView()
    client_main(obj=Parts(uplink=lambda: ReplayingUplink(view, honest)))


if __name__ == "__main__":
    main()
