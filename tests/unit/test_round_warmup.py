"""The warmup part: readiness announcements and the warmup witness, once per Warmup."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from psyche_client.round.context import RoundContext
from psyche_client.round.warmup import Warmup, warmup_tag
from psyche_client.stats import ClientStats
from psyche_client.training.backend import DummyBackend
from psyche_common.config import P2PCheckpoint
from psyche_common.coordinator import RunState
from psyche_common.protocol import Identity


class Recorder:
    def __init__(self) -> None:
        self.announced: list[Any] = []
        self.warmup_witnesses: list[Any] = []

    async def announce(self, announcement: Any) -> None:
        self.announced.append(announcement)

    async def send_warmup_witness(self, witness: Any) -> None:
        self.warmup_witnesses.append(witness)


def warmup_state(me: bytes, started: int) -> Any:
    return SimpleNamespace(
        run_state=RunState.Warmup,
        epoch_state=SimpleNamespace(clients=[SimpleNamespace(id=me)], start_timestamp=started),
        progress=SimpleNamespace(step=7, epoch=1),
        model=SimpleNamespace(checkpoint=P2PCheckpoint(repo_id="builtin:llama-tiny")),
    )


async def test_a_warmup_that_ended_without_a_round_does_not_silence_the_next() -> None:
    identity = Identity.generate()
    ctx = RoundContext(identity, ClientStats())
    ctx.backend = DummyBackend(0.0)
    recorder = Recorder()

    async def reload(_coordinator: Any) -> None:
        raise AssertionError("the checkpoint is peer-to-peer: nothing to reload")

    warmup = Warmup(ctx, recorder, recorder, None, reload)  # type: ignore[arg-type]
    first = warmup_state(identity.public_key, 1000)
    ctx.coordinator = first
    warmup.loaded_for(first)
    await warmup.tick(0.0)
    assert len(recorder.warmup_witnesses) == 1
    # the Warmup went back to WaitingForMembers (no round started), then a new one began
    second = warmup_state(identity.public_key, 1010)
    assert warmup_tag(second) != warmup_tag(first)
    ctx.coordinator = second
    warmup.loaded_for(second)
    await warmup.tick(5.0)
    assert len(recorder.warmup_witnesses) == 2
