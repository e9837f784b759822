"""A test-only false accuser: every round it accuses every trainer of the previous round in
a health check, whatever its blooms say; its witnesses are honest.

It is `psyche-client` with that one change (the accusation half of tests/e2e/lying_client.py,
without the all-ones blooms); it trains and serves its results honestly. Run it with
`psyche-client`'s arguments: `python tests/e2e/accuser_client.py train --server-addr ...`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts

from tests.e2e.lying_client import accuse_every_trainer


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(accusation=accuse_every_trainer))


if __name__ == "__main__":
    main()
