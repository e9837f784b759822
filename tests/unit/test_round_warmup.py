"""The warmup part: readiness announcements and the warmup witness, once per Warmup."""

from __future__ import annotations

from typing import Any

from psyche_client.round.context import RoundContext
from psyche_client.round.stats import ClientStats
from psyche_client.round.warmup import Warmup, warmup_tag
from psyche_client.training.backend import DummyBackend
from psyche_common.coordinator import Coordinator, RunState
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in
from tests.support.fakes import RecordingUplink, lone_network


def warmup_state(me: bytes, started: int) -> Coordinator:
    """The Warmup of epoch 1 at step 7 (P2P checkpoint), begun at `started`, `me` its member."""
    return coordinator_in(
        RunState.Warmup,
        [me],
        step=7,
        epoch=1,
        checkpoint={"P2P": {"repo_id": "builtin:llama-tiny"}},
        now=started,
    )


async def test_a_warmup_that_ended_without_a_round_does_not_silence_the_next() -> None:
    identity = Identity.generate()
    ctx = RoundContext(identity, ClientStats())
    ctx.backend = DummyBackend(0.0)
    network, uplink = lone_network(identity.public_key), RecordingUplink(identity.public_key)

    async def reload(_coordinator: Any) -> None:
        raise AssertionError("the checkpoint is peer-to-peer: nothing to reload")

    warmup = Warmup(ctx, network, uplink, None, reload)
    first = warmup_state(identity.public_key, 1000)
    ctx.coordinator = first
    warmup.loaded_for(first)
    await warmup.tick(0.0)
    assert len(uplink.warmup_witnesses) == 1
    # the Warmup went back to WaitingForMembers (no round started), then a new one began
    second = warmup_state(identity.public_key, 1010)
    assert warmup_tag(second) != warmup_tag(first)
    ctx.coordinator = second
    warmup.loaded_for(second)
    await warmup.tick(5.0)
    assert len(uplink.warmup_witnesses) == 2
