"""A `RoundRunner` on the dummy backend with no peers: for tests of one stage of the round
pipeline, or of the shell parts that read the runner (dashboard, resync notices)."""

from __future__ import annotations

from psyche_client.round.ports import RunnerOptions
from psyche_client.round.runner import RoundRunner
from psyche_client.round.stats import ClientStats
from psyche_client.training.backend import DummyBackend
from psyche_common.coordinator import Coordinator
from psyche_common.protocol import Identity

from tests.support.fakes import RecordingUplink, lone_network


def lone_runner(
    identity: Identity | None = None,
    uplink: RecordingUplink | None = None,
    stats: ClientStats | None = None,
) -> RoundRunner:
    """A runner whose network has no peers, whose uplink records (`uplink`, else a fresh one)
    and whose backend is the dummy one, already loaded; batches need no data."""
    identity = identity or Identity.generate()

    async def load(_coordinator: Coordinator) -> DummyBackend:
        return DummyBackend(0.0)

    runner = RoundRunner(
        identity,
        lone_network(identity.public_key),
        uplink or RecordingUplink(identity.public_key),
        load,
        None,
        RunnerOptions(download_backoff=0.0, needs_data=False),
        stats=stats,
    )
    runner.backend = DummyBackend(0.0)
    return runner
