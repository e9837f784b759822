"""Signed P2P announcements: construction, wire round trip, strict decoding, verification."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from psyche_client.p2p.announcements import (
    Announcement,
    AnnouncementError,
    FinishedAnnouncement,
    ResultAnnouncement,
    from_wire,
    make_finished_announcement,
    make_result_announcement,
    message_id,
    to_wire,
    verify_announcement,
)
from psyche_common.announcements import commitment_statement
from psyche_common.protocol import Identity, decode_payload, encode_payload, verify_signature

TRAINER = Identity.from_secret_bytes(bytes(range(32)))


def result() -> ResultAnnouncement:
    return make_result_announcement(
        TRAINER,
        run_id="test",
        round_seed=0,
        step=5,
        batch_start=8,
        batch_end=11,
        data_hash=hashlib.sha256(b"commitment").digest(),
        blob_hash=hashlib.sha256(b"blob").digest(),
        size=1234,
    )


def tampered(announcement: Announcement, **changes: object) -> Announcement:
    """`announcement` with fields changed after signing, as a relaying peer could send it."""
    return from_wire(to_wire(announcement) | changes)


def test_result_commitment_signature_binds_the_data_hash_the_blob_and_the_size() -> None:
    a = result()
    assert a.sender_id == TRAINER.public_key and a.batch_range == (8, 11)
    # version 3: not over the raw data hash (the reference's), over the whole statement
    assert not verify_signature(TRAINER.public_key, a.data_hash, a.commitment_signature)
    statement = commitment_statement(
        "test", 0, TRAINER.public_key, 5, 8, 11, a.data_hash, a.blob_hash, a.size
    )
    assert verify_signature(TRAINER.public_key, statement, a.commitment_signature)
    assert a.commitment == hashlib.sha256(statement).digest()
    verify_announcement(a)
    # the same data hash with another blob (another nonce in its header) is another
    # commitment, and a signature cannot be moved from one to the other
    other = tampered(a, blob_hash=hashlib.sha256(b"other blob").digest())
    assert other.commitment != a.commitment
    with pytest.raises(AnnouncementError, match="commitment_signature"):
        verify_announcement(other)
    # the run and the round's seed are signed: a commitment moved to another run or round
    # no longer verifies
    for changes in ({"run_id": "another-run"}, {"round_seed": 1}):
        with pytest.raises(AnnouncementError, match="commitment_signature"):
            verify_announcement(tampered(a, **changes))
    for changes, why in (({"run_id": ""}, "run_id"), ({"run_id": "x" * 33}, "run_id")):
        with pytest.raises(AnnouncementError, match=why):
            from_wire(to_wire(a) | changes)
    assert a.signed.verifies(verify_signature)
    assert not tampered(a, size=1).signed.verifies(verify_signature)
    assert a.signed.commitment_id == a.commitment


def test_finished_commitment_is_sha256_of_the_merkle_root() -> None:
    root = bytes(range(32))
    f = make_finished_announcement(TRAINER, step=0, warmup=True, broadcast_merkle=root)
    assert f.data_hash == hashlib.sha256(root).digest()
    verify_announcement(f)
    with pytest.raises(AnnouncementError, match="SHA-256"):
        verify_announcement(dataclasses.replace(f, data_hash=bytes(32)))


@pytest.mark.parametrize(
    "make",
    [
        result,
        lambda: make_finished_announcement(
            TRAINER, step=3, warmup=False, broadcast_merkle=bytes(32)
        ),
    ],
)
def test_wire_round_trip_through_msgpack(make) -> None:
    a = make()
    back = from_wire(decode_payload(encode_payload(to_wire(a))))
    assert back == a and type(back) is type(a)
    verify_announcement(back)
    assert message_id(back) == message_id(a)


@pytest.mark.parametrize(
    ("field", "value"),
    [("step", 6), ("batch_start", 9), ("batch_end", 12), ("blob_hash", bytes(32)), ("size", 1)],
)
def test_any_field_change_breaks_the_envelope(field: str, value: object) -> None:
    changed = tampered(result(), **{field: value})
    # the commitment signature covers these fields too, and is checked first
    with pytest.raises(AnnouncementError, match="signature does not verify"):
        verify_announcement(changed)


def test_foreign_commitment_signature_is_rejected() -> None:
    a = result()
    other = Identity.generate()
    with pytest.raises(AnnouncementError, match="commitment_signature"):
        verify_announcement(tampered(a, commitment_signature=other.sign(a.data_hash)))


def test_message_id_differs_between_messages() -> None:
    a = result()
    b = make_finished_announcement(TRAINER, step=5, warmup=False, broadcast_merkle=bytes(32))
    assert message_id(a) != message_id(b)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "gossip"}, "kind must be"),
        ({"step": -1}, "result.step must be an integer"),
        ({"step": 2**32}, "result.step must be an integer"),
        ({"step": True}, "result.step must be an integer"),
        ({"data_hash": b"short"}, "result.data_hash must be 32 bytes, got 5 bytes"),
        ({"sender_id": "text"}, "result.sender_id must be 32 bytes, got str"),
        ({"extra": 1}, "unknown fields"),
        ({"batch_start": 20}, "batch_end"),
    ],
)
def test_from_wire_names_the_bad_field(change: dict, message: str) -> None:
    wire = to_wire(result()) | change
    with pytest.raises(AnnouncementError, match=message):
        from_wire(wire)


def test_from_wire_rejects_missing_fields_and_non_maps() -> None:
    wire = to_wire(result())
    del wire["size"]
    with pytest.raises(AnnouncementError, match="missing fields \\['size'\\]"):
        from_wire(wire)
    with pytest.raises(AnnouncementError, match="must be a map"):
        from_wire([1, 2])
    wire = to_wire(
        make_finished_announcement(TRAINER, step=1, warmup=False, broadcast_merkle=bytes(32))
    )
    with pytest.raises(AnnouncementError, match=r"finished\.warmup must be a boolean"):
        from_wire(wire | {"warmup": 1})
    assert isinstance(from_wire(wire), FinishedAnnouncement)
