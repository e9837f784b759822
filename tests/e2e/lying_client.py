"""A test-only client that lies as a witness: every witness it sends carries all-ones blooms
(they "contain" every participant and result), and every round it accuses every trainer of
the previous round in a health check, whatever the blooms say.

It is `psyche-client` with those two changes; it trains and serves its results honestly. Run
it with `psyche-client`'s arguments: `python tests/e2e/lying_client.py train --server-addr ...`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.round.consensus import BloomLike
from psyche_client.session.uplink import SwitchableUplink
from psyche_common.bloom import Bloom
from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.coordinator.types import Witness
from psyche_common.protocol.messages import WitnessMetadata


class LyingUplink(SwitchableUplink):
    """Sends every witness with all bloom bits set."""

    async def send_witness(self, witness: Witness, metadata: WitnessMetadata) -> None:
        def saturated(bloom: Bloom) -> Bloom:
            return dataclasses.replace(bloom, bits=(1 << bloom.num_bits) - 1)

        lying = dataclasses.replace(
            witness,
            participant_bloom=saturated(witness.participant_bloom),
            broadcast_bloom=saturated(witness.broadcast_bloom),
        )
        await super().send_witness(lying, metadata)


def accuse_every_trainer(
    client_ids: Sequence[bytes],
    is_trainer: Callable[[int], bool],
    participant_blooms: Sequence[BloomLike],
    quorum: int,
    proof_for: Callable[[int], CommitteeProof],
) -> list[tuple[bytes, CommitteeProof]]:
    """An `AccusationPolicy` that accuses every trainer, whatever the blooms say."""
    return [(client_ids[i], proof_for(i)) for i in range(len(client_ids)) if is_trainer(i)]


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(uplink=LyingUplink, accusation=accuse_every_trainer))


if __name__ == "__main__":
    main()
