"""Round-runner behaviours checked in isolation (dummy backend, fake network and uplink)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from psyche_client.p2p.announcements import make_result_announcement
from psyche_client.round.consensus import Candidate
from psyche_client.round.ports import RunnerOptions
from psyche_client.round.roles import RoundRoles
from psyche_client.round.runner import RoundRunner
from psyche_client.round.state import DownloadStatus, ResultDownload, RoundState
from psyche_client.training.backend import DummyBackend, DummyResult, result_commitment
from psyche_common.assignment import BatchId
from psyche_common.bloom import Bloom
from psyche_common.committee import CommitteeSelection
from psyche_common.coordinator import RunState
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


def coordinator_with_witness(seen: list[bytes]) -> tuple[Any, list[Any]]:
    bloom = Bloom.random()
    for item in seen:
        bloom.add(item)
    witness = SimpleNamespace(broadcast_bloom=bloom, participant_bloom=Bloom())
    checkpoint = SimpleNamespace(kind="Hub")
    coordinator = SimpleNamespace(
        config=SimpleNamespace(witness_nodes=1),
        model=SimpleNamespace(checkpoint=checkpoint, cold_start_warmup_steps=0),
        progress=SimpleNamespace(epoch=0, step=5),
        run_state=RunState.RoundTrain,
    )
    return coordinator, [witness]


def verified(data_hash: bytes, owner: bytes, batch: BatchId, payload: bytes) -> ResultDownload:
    announcement = SimpleNamespace(sender_id=owner, data_hash=data_hash)
    return ResultDownload(
        announcement,  # type: ignore[arg-type]
        batch,
        status=DownloadStatus.VERIFIED,
        result=DummyResult(payload),
    )


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
    runner.ctx.coordinator = SimpleNamespace(  # type: ignore[assignment]
        epoch_state=SimpleNamespace(clients=[SimpleNamespace(id=sender.public_key)]),
        progress=SimpleNamespace(epoch=0, step=4),
        run_state=RunState.RoundTrain,
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
    assert runner.exchange.early == [early]
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
    runner.ctx.coordinator = SimpleNamespace(  # type: ignore[assignment]
        epoch_state=SimpleNamespace(clients=[SimpleNamespace(id=sender.public_key)]),
        progress=SimpleNamespace(epoch=0, step=4),
        run_state=RunState.RoundTrain,
    )

    def announced(size: int, data_hash: bytes) -> Any:
        return make_result_announcement(
            sender, step=4, batch_start=0, batch_end=3, data_hash=data_hash,
            blob_hash=b"b" * 32, size=size,
        )  # fmt: skip

    exact = DummyBackend.PAYLOAD_SIZE
    for size in (exact + 1, exact - 1, 1 << 30):
        runner.exchange.accept_result(round_, announced(size, bytes([size % 251]) * 32))
        assert round_.downloads == {}
        assert f"from {sender.short_id} refused: it announces {size} bytes" in caplog.text
        assert f"takes exactly {exact}" in caplog.text
    runner.exchange.accept_result(round_, announced(exact, b"x" * 32))
    assert list(round_.downloads) == [b"x" * 32]
    for download in round_.downloads.values():
        assert download.task is not None
        download.task.cancel()
