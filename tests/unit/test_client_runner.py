"""Round-runner behaviours checked in isolation (dummy backend, fake network and uplink)."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
from psyche_client.p2p.announcements import make_result_announcement
from psyche_client.p2p.inbox import verify
from psyche_client.round.consensus import Candidate
from psyche_client.round.roles import RoundRoles
from psyche_client.round.runner import RoundRunner
from psyche_client.round.state import DownloadStatus, ResultDownload, RoundState
from psyche_client.training.backend import DummyBackend, DummyResult, result_commitment
from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom
from psyche_common.coordinator import (
    ClientState,
    Conviction,
    Coordinator,
    RunState,
    VerificationRecord,
    Witness,
)
from psyche_common.coordinator.committee import CommitteeSelection, WitnessProof
from psyche_common.protocol import Identity

from tests.support.coordinators import (
    coordinator_in,
    ids,
    make_coordinator,
    to_round_train,
    witness_round,
)
from tests.support.fakes import RecordingUplink
from tests.support.rounds import downloaded, observer_round
from tests.support.runners import lone_runner


def make_runner() -> tuple[RoundRunner, RecordingUplink]:
    uplink = RecordingUplink()
    return lone_runner(uplink=uplink), uplink


def source_round(batch: BatchId, step: int, owner: bytes) -> RoundState:
    return observer_round(step, {batch: owner})


def coordinator_with_witness(
    seen: list[bytes], convictions: list[Conviction] | None = None
) -> tuple[Coordinator, list[Witness]]:
    """Round training at step 5 of epoch 0 (Hub checkpoint), and one witness whose broadcast
    bloom holds `seen`."""
    bloom = Bloom.random()
    for item in seen:
        bloom.add(item)
    witness = Witness(WitnessProof(0, 0, True), participant_bloom=Bloom(), broadcast_bloom=bloom)
    coordinator = coordinator_in(RunState.RoundTrain, ids(2), step=5)
    coordinator.verification = VerificationRecord(convictions=list(convictions or []))
    return coordinator, [witness]


def verified(data_hash: bytes, owner: bytes, batch: BatchId, payload: bytes) -> ResultDownload:
    return downloaded(data_hash, owner, batch, DummyResult(payload))


async def test_apply_uses_the_witnessed_payload_and_reports_the_hash() -> None:
    runner, uplink = make_runner()
    batch = BatchId(0, 3)
    payload = b"p" * DummyBackend.PAYLOAD_SIZE
    data_hash = result_commitment(3, batch, payload)
    source = source_round(batch, 3, b"o" * 32)
    source.candidates[batch] = [Candidate(b"o" * 32, data_hash)]
    source.downloads[data_hash] = verified(data_hash, b"o" * 32, batch, payload)
    before = runner.backend.weights_hash()
    coordinator, witnesses = coordinator_with_witness([data_hash])
    weights = await runner.applier.apply(source, witnesses, coordinator, 5)
    await runner.applier.report(5, weights)
    after = runner.backend.weights_hash()
    assert after != before and weights == after
    assert uplink.health == [([], 5, after)]
    # a result no witness saw changes nothing
    other = source_round(batch, 3, b"o" * 32)
    other.candidates[batch] = [Candidate(b"o" * 32, data_hash)]
    other.downloads[data_hash] = verified(data_hash, b"o" * 32, batch, payload)
    coordinator, witnesses = coordinator_with_witness([])
    await runner.applier.apply(other, witnesses, coordinator, 6)
    assert runner.backend.weights_hash() == after


@pytest.mark.parametrize(("convicted_at", "applied"), [(3, False), (2, False), (4, True)])
async def test_a_convicted_trainers_results_are_not_applied(
    convicted_at: int, applied: bool
) -> None:
    runner, _ = make_runner()
    batch = BatchId(0, 3)
    owner = b"o" * 32
    payload = b"p" * DummyBackend.PAYLOAD_SIZE
    data_hash = result_commitment(3, batch, payload)
    source = source_round(batch, 3, owner)
    source.candidates[batch] = [Candidate(owner, data_hash)]
    source.downloads[data_hash] = verified(data_hash, owner, batch, payload)
    conviction = Conviction(0, convicted_at, owner, batch, (b"v" * 32,), 10)
    coordinator, witnesses = coordinator_with_witness([data_hash], [conviction])
    before = runner.backend.weights_hash()
    weights = await runner.applier.apply(source, witnesses, coordinator, 5)
    assert weights is not None and runner.ctx.out_of_sync is None
    # convicted at the result's step or before: skipped (nothing applied, weights unchanged)
    assert (weights != before) is applied


async def test_a_convicted_trainers_missing_result_does_not_desync() -> None:
    runner, _ = make_runner()
    batch = BatchId(0, 3)
    owner = b"o" * 32
    source = source_round(batch, 3, owner)  # its announcement never reached us
    coordinator, witnesses = coordinator_with_witness([])
    witnesses[0].participant_bloom.add(hashlib.sha256(owner).digest())  # but a witness saw it
    conviction = Conviction(0, 3, owner, batch, (b"v" * 32,), 10)
    coordinator.verification = VerificationRecord(convictions=[conviction])
    assert await runner.applier.apply(source, witnesses, coordinator, 5) is not None
    assert runner.ctx.out_of_sync is None


async def test_a_missing_consensus_payload_puts_the_client_out_of_sync() -> None:
    runner, uplink = make_runner()
    batch = BatchId(0, 3)
    data_hash = b"h" * 32
    source = source_round(batch, 3, b"o" * 32)
    source.candidates[batch] = [Candidate(b"o" * 32, data_hash)]
    download = verified(data_hash, b"o" * 32, batch, b"")
    download.status, download.result = DownloadStatus.FAILED, None
    download.task = asyncio.ensure_future(asyncio.sleep(0.01))
    source.downloads[data_hash] = download
    coordinator, witnesses = coordinator_with_witness([data_hash])
    before = runner.backend.weights_hash()
    assert await runner.applier.apply(source, witnesses, coordinator, 5) is None
    assert runner.backend.weights_hash() == before  # nothing applied, nothing reported
    assert uplink.health == []
    assert runner.ctx.out_of_sync is not None
    assert "could not be downloaded" in runner.ctx.out_of_sync
    assert runner.stats.sync_status.startswith("out of sync")
    assert runner.fatal is None  # no longer the end of the client


async def test_announcements_for_a_future_round_are_kept_for_later() -> None:
    runner, _ = make_runner()
    sender = Identity.generate()
    current = source_round(BatchId(0, 3), 4, sender.public_key)
    runner.ctx.current = current
    runner.ctx.coordinator = coordinator_in(RunState.RoundTrain, [sender.public_key], step=4)
    early = make_result_announcement(
        sender,
        run_id="test",
        round_seed=0,
        step=5,
        batch_start=0,
        batch_end=3,
        data_hash=b"d" * 32,
        blob_hash=b"b" * 32,
        size=64,
    )
    stale = make_result_announcement(
        sender,
        run_id="test",
        round_seed=0,
        step=2,
        batch_start=0,
        batch_end=3,
        data_hash=b"e" * 32,
        blob_hash=b"c" * 32,
        size=64,
    )
    runner.on_announcement(verify(early))
    runner.on_announcement(verify(stale))
    assert runner.exchange.early.kept == [verify(early)]
    assert current.downloads == {}


async def test_a_result_announced_at_another_size_than_the_layout_is_refused(caplog) -> None:
    """The run's layout fixes every result's size: an announcement of any other size is
    refused, naming the peer, before a byte is fetched (no download is started)."""
    runner, _ = make_runner()
    sender = Identity.generate()
    batch = BatchId(0, 3)
    roles = RoundRoles(
        step=4,
        height=1,
        my_index=None,
        committee_proof=None,
        witness_proof=None,
        selection=CommitteeSelection.new(0, 1, 0, 1, 7),  # one client, the trainer
        assignments={batch: sender.public_key},
        batch_ids=(batch,),
        my_batches=(),
    )
    round_ = RoundState.start(roles, 1, True, 0.0, bloom_factory=lambda n: Bloom.random())
    runner.ctx.coordinator = coordinator_in(RunState.RoundTrain, [sender.public_key], step=4)

    def announced(size: int, data_hash: bytes) -> Any:
        return make_result_announcement(
            sender, run_id="test", round_seed=0, step=4, batch_start=0, batch_end=3, data_hash=data_hash,
            blob_hash=b"b" * 32, size=size,
        )  # fmt: skip

    exact = DummyBackend.PAYLOAD_SIZE
    for size in (exact + 1, exact - 1, 1 << 30):
        runner.exchange.accept_result(round_, announced(size, bytes([size % 251]) * 32))
        assert round_.downloads == {}
        assert f"from {sender.short_id} refused: it announces {size} bytes" in caplog.text
        assert f"takes exactly {exact}" in caplog.text
    good = announced(exact, b"x" * 32)
    runner.exchange.accept_result(round_, good)
    assert list(round_.downloads) == [good.commitment]
    for download in round_.downloads.values():
        assert download.task is not None
        download.task.cancel()


async def test_no_health_check_when_members_left_since_the_previous_round() -> None:
    def coordinator(drop_one: bool) -> tuple[Coordinator, int]:
        coord = make_coordinator(witness_nodes=0)
        members = ids(4)
        now = to_round_train(coord, members)
        now = witness_round(coord, now)
        if drop_one:  # a member in the middle leaves at the next round start
            coord.epoch_state.clients[1].state = ClientState.Dropped
        return coord, witness_round(coord, now, seen=[])  # nobody saw any trainer

    for drop_one, expect_checks in ((False, True), (True, False)):
        coord, _ = coordinator(drop_one)
        assert coord.current_round().height == 2
        runner, uplink = make_runner()
        runner.ctx.coordinator = coord
        await runner.witnessing.send_health_checks(coord)
        assert bool(uplink.health) is expect_checks, (drop_one, uplink.health)


async def test_the_pipeline_is_idle_only_when_nothing_is_due_of_the_model() -> None:
    from psyche_client.round.phase import Phase
    from psyche_client.round.prepare import PreparedRound

    runner = lone_runner()
    backend = runner.backend
    runner.backend = None
    assert not runner.is_idle()  # no model yet
    runner.backend = backend
    runner.ctx.phase = Phase.WARMUP
    assert runner.is_idle()
    runner.ctx.phase = Phase.TRAINING
    round_ = observer_round(3, {})
    runner.ctx.current = round_
    assert not runner.is_idle()  # the round's training has not ended
    round_.end_training(1.0)
    assert runner.is_idle()
    runner.ctx.phase = Phase.WITNESS
    busy: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    prepared = PreparedRound(key=None, witnesses=[], round_=observer_round(4, {}))  # type: ignore[arg-type]
    prepared.train_task = busy  # type: ignore[assignment]
    runner.preparer.prepared = prepared
    assert not runner.is_idle()  # the next round is being prepared
    busy.set_result(None)
    assert runner.is_idle()
    runner.ctx.phase = Phase.COOLDOWN
    assert runner.is_idle()
