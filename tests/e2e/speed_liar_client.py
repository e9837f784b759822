"""A test-only client that lies about speed as a witness: every witness it sends says each
result of the attested round arrived 1 ms after that round began (as fast as can be, its own
included). It trains and serves its results honestly.

Run it with `psyche-client`'s arguments: `python tests/e2e/speed_liar_client.py train ...`.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.session.uplink import SwitchableUplink
from psyche_common.coordinator.types import Witness
from psyche_common.protocol.messages import WitnessMetadata


class SpeedLiarUplink(SwitchableUplink):
    """Sends every witness with every result timed at 1 ms."""

    async def send_witness(self, witness: Witness, metadata: WitnessMetadata) -> None:
        lying = dataclasses.replace(witness, result_ms=[1] * len(witness.result_ms))
        await super().send_witness(lying, metadata)


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(uplink=SpeedLiarUplink))


if __name__ == "__main__":
    main()
