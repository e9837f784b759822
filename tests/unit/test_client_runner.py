"""Round-runner behaviours checked in isolation (dummy backend, fake network and uplink)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from psyche_client.p2p.announcements import make_result_announcement
from psyche_client.round.consensus import Candidate
from psyche_client.round.ports import DesyncError, RunnerOptions
from psyche_client.round.roles import RoundRoles
from psyche_client.round.runner import RoundRunner
from psyche_client.round.state import RoundState
from psyche_client.training.backend import DummyBackend, result_commitment
from psyche_common.assignment import BatchId
from psyche_common.bloom import Bloom
from psyche_common.protocol import Identity


class NullNetwork:
    def __init__(self) -> None:
        self.announced: list[Any] = []

    async def announce(self, announcement: Any) -> None:
        self.announced.append(announcement)

    def publish_blob(self, data: bytes, step: int) -> bytes:
        return b"\x00" * 32

    async def fetch_blob(self, blob_hash: bytes, size: int, providers: Any) -> bytes:
        raise ConnectionError("nobody has it")

    def begin_step(self, step: int) -> None:
        return None


class RecordingUplink:
    def __init__(self) -> None:
        self.health: list[tuple[list, int, bytes]] = []

    async def send_witness(self, witness: dict, metadata: dict) -> None: ...

    async def send_warmup_witness(self, witness: dict) -> None: ...

    async def send_health_check(self, checks: list, step: int, weights_hash: bytes) -> None:
        self.health.append((checks, step, weights_hash))

    async def send_checkpoint(self, checkpoint: dict) -> None: ...


def make_runner() -> tuple[RoundRunner, RecordingUplink]:
    uplink = RecordingUplink()

    async def load(_c: Any) -> DummyBackend:
        return DummyBackend(0.0)

    runner = RoundRunner(
        Identity.generate(),
        NullNetwork(),
        uplink,
        load,
        None,
        RunnerOptions(download_backoff=0.0, needs_data=False),
    )
    runner.backend = DummyBackend(0.0)
    return runner, uplink


def source_round(batch: BatchId, step: int, owner: bytes) -> RoundState:
    roles = RoundRoles(
        step=step,
        height=1,
        my_index=None,
        committee_proof=None,
        witness_proof=None,
        selection=None,
        assignments={batch: owner},
        batch_ids=(batch,),
        my_batches=(),
    )
    return RoundState.start(roles, 2, True, 0.0, bloom_factory=lambda n: Bloom.random())


def coordinator_with_witness(seen: list[bytes]) -> SimpleNamespace:
    bloom = Bloom.random()
    for item in seen:
        bloom.add(item)
    witness = SimpleNamespace(broadcast_bloom=bloom, participant_bloom=Bloom())
    checkpoint = SimpleNamespace(kind="Hub")
    return SimpleNamespace(
        previous_round=lambda: SimpleNamespace(witnesses=[witness]),
        config=SimpleNamespace(witness_nodes=1),
        model=SimpleNamespace(checkpoint=checkpoint, cold_start_warmup_steps=0),
        progress=SimpleNamespace(epoch=0, step=5),
        run_state="RoundTrain",
    )


async def test_apply_uses_the_witnessed_payload_and_reports_the_hash() -> None:
    runner, uplink = make_runner()
    batch = BatchId(0, 3)
    payload = b"p" * DummyBackend.PAYLOAD_SIZE
    data_hash = result_commitment(3, batch, payload)
    source = source_round(batch, 3, b"o" * 32)
    source.candidates[batch] = [Candidate(b"o" * 32, data_hash)]
    source.payloads[data_hash] = payload
    before = runner.backend.weights_hash()
    await runner._apply(source, coordinator_with_witness([data_hash]), 5)
    after = runner.backend.weights_hash()
    assert after != before
    assert uplink.health == [([], 5, after)]
    # a result no witness saw changes nothing
    other = source_round(batch, 3, b"o" * 32)
    other.candidates[batch] = [Candidate(b"o" * 32, data_hash)]
    other.payloads[data_hash] = payload
    await runner._apply(other, coordinator_with_witness([]), 6)
    assert runner.backend.weights_hash() == after


async def test_missing_consensus_payload_is_a_desync() -> None:
    runner, _ = make_runner()
    batch = BatchId(0, 3)
    data_hash = b"h" * 32
    source = source_round(batch, 3, b"o" * 32)
    source.candidates[batch] = [Candidate(b"o" * 32, data_hash)]
    source.downloads[data_hash] = asyncio.ensure_future(asyncio.sleep(0.01))
    with pytest.raises(DesyncError, match="could not be downloaded"):
        await runner._apply(source, coordinator_with_witness([data_hash]), 5)


async def test_announcements_for_a_future_round_are_kept_for_later() -> None:
    runner, _ = make_runner()
    sender = Identity.generate()
    current = source_round(BatchId(0, 3), 4, sender.public_key)
    runner.current = current
    runner.coordinator = SimpleNamespace(
        epoch_state=SimpleNamespace(clients=[SimpleNamespace(id=sender.public_key)]),
        progress=SimpleNamespace(epoch=0, step=4),
        run_state="RoundTrain",
    )
    early = make_result_announcement(
        sender,
        step=5,
        batch_start=0,
        batch_end=3,
        data_hash=b"d" * 32,
        blob_hash=b"b" * 32,
        size=64,
    )
    stale = make_result_announcement(
        sender,
        step=2,
        batch_start=0,
        batch_end=3,
        data_hash=b"e" * 32,
        blob_hash=b"c" * 32,
        size=64,
    )
    runner.on_announcement(early)
    runner.on_announcement(stale)
    assert runner._early == [early]
    assert current.announcements == {}
