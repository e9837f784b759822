"""A test-only relay hog: a member that asks the relay for every pipe it can get to one
victim, from four addresses at once.

It is `psyche-client` with one addition: once it is a member of a training round, it starts a
`bench.harness.squatters.RelayHog` with its own key (the file named by
`PSYCHE_ATTACK_IDENTITY`, the one it is given with `-i`), dialing the first other member by id
from 127.0.0.2 to 127.0.0.5 in bursts of 96 dials, and holds every pipe it is granted. It
trains, witnesses and serves honestly. At every new step it logs `relay hog: dials answered`
(fields `bursts`, `granted`: the most dials one burst got, `refused`, `victim`). Run it with
`psyche-client`'s arguments and `-i KEY`:
`PSYCHE_ATTACK_IDENTITY=KEY python tests/e2e/relay_hog_client.py train -i KEY ...`.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_common.client_id import short_id
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.types import RunState
from psyche_common.protocol import Identity

from bench.harness.squatters import RelayHog
from tests.e2e.public_view import PublicView, TappingUplink

log = logging.getLogger("psyche.client")


class Hogging:
    """Starts the hog at the first training round this client is a member of."""

    def __init__(self, identity: Identity, port: int) -> None:
        self.identity = identity
        self.port = port
        self.hog: RelayHog | None = None
        self.step = -1

    def on_update(self, coordinator: Coordinator) -> None:
        me = self.identity.public_key
        members = sorted(c.id for c in coordinator.epoch_state.clients)
        if self.hog is None and coordinator.run_state == RunState.RoundTrain and me in members:
            victim = next((m for m in members if m != me), None)
            if victim is not None:
                run_id = coordinator.run_id
                self.hog = RelayHog(self.port, run_id, self.identity, victim)
                self.hog.start()
        step = coordinator.progress.step
        if self.hog is not None and step != self.step:
            self.step = step
            log.info(
                "relay hog: dials answered",
                extra={
                    "bursts": self.hog.bursts,
                    "granted": self.hog.granted,
                    "refused": self.hog.refused,
                    "victim": short_id(self.hog.victim),
                    "reasons": dict(self.hog.reasons),
                },
            )


def server_port(argv: list[str]) -> int:
    """The port of `--server-addr HOST:PORT` (the relay shares the coordinator's port)."""
    address = argv[argv.index("--server-addr") + 1]
    return int(address.rsplit(":", 1)[1])


def main() -> None:
    from psyche_client.cli import main as client_main

    identity = Identity.load(os.environ["PSYCHE_ATTACK_IDENTITY"])
    hogging = Hogging(identity, server_port(sys.argv))
    view = PublicView()
    client_main(obj=Parts(uplink=lambda: TappingUplink(view, hogging.on_update)))


if __name__ == "__main__":
    main()
