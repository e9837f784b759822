"""Bans on proof are never evicted: the coordinator keeps keys convicted on self-proving
evidence apart from the epoch's convictions (`VerificationRecord.bans`), so neither 300 later
proven convictions nor 300 epoch-scoped ones lift an earlier ban; the bans survive a save and
a restore through the state file; only the current epoch's convictions are broadcast; a full
ban list evicts nothing (the next proven key is removed for its epoch only)."""

from __future__ import annotations

import logging
import tomllib

import pytest
import tomli_w
from psyche_common.batch_id import BatchId
from psyche_common.config import parse_state
from psyche_common.coordinator import Coordinator, RunState
from psyche_common.coordinator.accusations import record_conviction
from psyche_common.coordinator.verdicts import (
    MAX_BANS,
    MAX_CONVICTIONS,
    Conviction,
    ConvictionKind,
    VerificationRecord,
)
from psyche_server.client_messages import ConvictionLog

from tests.support.coordinators import coordinator_in

BATCH = BatchId(0, 3)
REPORTER = b"\xee" * 32


def key(n: int) -> bytes:
    return n.to_bytes(4, "big") + bytes(28)


def coordinator() -> Coordinator:
    return coordinator_in(RunState.RoundTrain, [key(10_000 + n) for n in range(2)], step=4)


def prove(coord: Coordinator, keys: range, *, epochs: bool = True) -> None:
    """Convict each of `keys` on proof, one epoch each when `epochs` (the epoch's convictions
    then go at the next epoch's start, as in a run)."""
    for n in keys:
        if epochs:
            coord.progress.epoch += 1
            coord.verification.new_epoch(coord.progress.epoch)
        coord.convict_proven(key(n), coord.progress.step, BATCH, REPORTER)


def restored(coord: Coordinator) -> Coordinator:
    """`coord` saved to TOML text and loaded back as a restarted server would."""
    text = tomli_w.dumps(coord.to_state_file().to_toml_dict())
    return Coordinator.from_state_file(parse_state(tomllib.loads(text)))


def test_300_proven_convictions_leave_the_first_key_banned() -> None:
    coord = coordinator()
    prove(coord, range(300))
    record, epoch = coord.verification, coord.progress.epoch
    assert len(record.bans) == 300 and record.banned(key(0), epoch + 1)
    assert all(record.banned(key(n), epoch + 1) for n in range(300))
    assert not record.banned(key(300), epoch + 1)
    # only the current epoch's convictions are broadcast: the bans stay on the server
    wire = coord.to_wire()["verification"]
    assert [c["trainer"] for c in wire["convictions"]] == [key(299)]
    assert "bans" not in wire


def test_many_proofs_in_one_epoch_keep_every_ban() -> None:
    coord = coordinator()
    prove(coord, range(300), epochs=False)
    record = coord.verification
    assert len(record.convictions) == MAX_CONVICTIONS  # the broadcast list is capped
    assert record.convicted(key(0), coord.progress.epoch) is None  # evicted from it ...
    assert record.banned(key(0), coord.progress.epoch + 1)  # ... but still banned


def test_epoch_scoped_convictions_do_not_push_out_proven_ones() -> None:
    coord = coordinator()
    prove(coord, range(1))
    epoch = coord.progress.epoch
    for n in range(300):
        record_conviction(coord, Conviction(epoch, 4, key(1 + n), BATCH, (REPORTER,), 100))
    record = coord.verification
    assert all(c.kind == ConvictionKind.VERIFIERS for c in record.convictions)
    assert record.banned(key(0), epoch + 3)
    assert not record.banned(key(1), epoch + 1)  # epoch-scoped: admitted next epoch
    coord.verification.new_epoch(epoch + 1)
    assert record.convictions == [] and record.banned(key(0), epoch + 1)


def test_bans_survive_a_save_and_a_restore() -> None:
    coord = coordinator()
    prove(coord, range(300))
    back = restored(coord)
    assert back.verification.bans == coord.verification.bans
    assert back.verification.banned(key(0), back.progress.epoch + 1)
    assert restored(back).verification.bans == coord.verification.bans


def test_a_full_ban_list_evicts_nothing() -> None:
    record = VerificationRecord()
    for n in range(MAX_BANS):
        assert record.ban(Conviction(n, 0, key(n), BATCH, (REPORTER,), 0, ConvictionKind.PROVEN))
    late = Conviction(0, 0, key(MAX_BANS), BATCH, (REPORTER,), 0, ConvictionKind.PROVEN)
    assert not record.ban(late)
    assert len(record.bans) == MAX_BANS and record.banned(key(0), 10**6)
    record.convictions.append(late)  # what `record_conviction` keeps: its epoch only
    assert record.banned(key(MAX_BANS), 0)
    record.new_epoch(1)
    assert not record.banned(key(MAX_BANS), 1) and record.banned(key(0), 1)


def test_the_server_logs_a_proven_key_it_cannot_ban(caplog: pytest.LogCaptureFixture) -> None:
    coord = coordinator()
    convictions = ConvictionLog(coord.verification)
    for n in range(MAX_BANS):
        coord.verification.ban(
            Conviction(0, 0, key(n), BATCH, (REPORTER,), 0, ConvictionKind.PROVEN)
        )
    coord.convict_proven(key(MAX_BANS), coord.progress.step, BATCH, REPORTER)
    assert convictions.log_new(coord.verification) == 1
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "cannot be banned for later epochs" in error.getMessage()
    assert "MAX_BANS" in error.getMessage()
