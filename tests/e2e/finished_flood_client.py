"""A test-only Finished flooder: a member that, after each Finished it announces, pushes
`early_flood_client.FLOOD` signed Finished announcements for that same step to every other
member, each with another Merkle root (so each is new to the peers' de-duplication).

It is `early_flood_client` with the flood's step changed: every announcement names the step
just finished. Each peer takes one Finished per sender and step (ours, already sent) and
refuses the rest without forwarding them. Each flood is logged as `finished_flood: pushed`
with the peers' answers counted by status. Run it with `psyche-client`'s arguments:
`python tests/e2e/finished_flood_client.py train --server-addr ...`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts

from tests.e2e.early_flood_client import FloodingNetwork


class FinishedFloodingNetwork(FloodingNetwork):
    label = "finished_flood"

    def flood_step(self, step: int) -> int:
        return step


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(network=FinishedFloodingNetwork))


if __name__ == "__main__":
    main()
