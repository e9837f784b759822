"""Blob store, transfer stats, model manifest, config and address parsing."""

from __future__ import annotations

import hashlib

import pytest
from psyche_client.p2p.blobs import BlobStore, blob_hash
from psyche_client.p2p.config import P2PConfig
from psyche_client.p2p.connection import parse_address
from psyche_client.p2p.manifest import ManifestError, ModelManifest, ParameterInfo, parameter_info
from psyche_client.p2p.stats import TransferStats
from psyche_common.protocol import decode_payload, encode_payload


def test_blob_store_is_content_addressed_and_prunes_by_step() -> None:
    store = BlobStore()
    h1 = store.put(b"one", step=1)
    h2 = store.put(b"two", step=3)
    h3 = store.put(b"model")
    assert h1 == hashlib.sha256(b"one").digest() == blob_hash(b"one")
    assert store.get(h1) == b"one" and h2 in store and len(store) == 3
    store.put(b"one", step=4)  # re-added later: kept with the newer step
    assert store.prune_before(3) == 0
    assert store.prune_before(5) == 2
    assert list(store.hashes()) == [h3] and store.total_bytes == 5
    assert store.remove(h3) and not store.remove(h3) and store.get(h3) is None


def test_stats_attribute_bytes_to_steps_and_peers() -> None:
    stats = TransferStats(keep_steps=2)
    stats.set_step(1)
    stats.record_sent(b"p", 10)
    stats.set_step(2)
    stats.record_received(b"p", 7)
    stats.record_received(None, 3)
    assert stats.for_step(1).bytes_sent == 10 and stats.current().bytes_received == 10
    assert stats.peers[b"p"].bytes_sent == 10 and stats.peers[b"p"].bytes_received == 7
    stats.set_step(3)
    assert list(stats.steps()) == [2, 3] and stats.for_step(1).bytes_sent == 0
    assert (stats.total_sent, stats.total_received) == (10, 10)


def manifest() -> ModelManifest:
    return ModelManifest.build(
        step=7,
        epoch=1,
        parameters=[
            parameter_info("b.weight", "bfloat16", [2, 3], b"x" * 12),
            parameter_info("a.bias", "float32", [3], b"y" * 12),
        ],
        config_json="{}",
    )


def test_manifest_is_sorted_and_round_trips() -> None:
    m = manifest()
    assert [p.name for p in m.parameters] == ["a.bias", "b.weight"]
    assert m.parameter("b.weight").shape == (2, 3) and m.parameter("zzz") is None
    assert m.total_bytes == 24
    assert ModelManifest.decode(m.encode()) == m
    assert ModelManifest.decode(m.encode()).digest() == m.digest()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda w: w.update(format="x"), "format"),
        (lambda w: w.update(step=-1), "manifest.step"),
        (lambda w: w.update(tokenizer_json=None), "tokenizer_json"),
        (lambda w: w["parameters"][0].update(sha256=b"1"), r"parameters\[0\].sha256"),
        (lambda w: w["parameters"][1].update(shape=[1, -2]), r"parameters\[1\].shape"),
        (lambda w: w["parameters"].reverse(), "sorted by name"),
        (lambda w: w["parameters"].append(dict(w["parameters"][0])), "unique"),
    ],
)
def test_manifest_decoding_names_bad_fields(mutate, message: str) -> None:
    wire = decode_payload(manifest().encode())
    mutate(wire)
    with pytest.raises(ManifestError, match=message):
        ModelManifest.decode(encode_payload(wire))
    with pytest.raises(ManifestError, match="not msgpack"):
        ModelManifest.decode(b"\xc1")


def test_parameter_info_hashes_the_bytes() -> None:
    info = parameter_info("w", "uint8", (4,), b"abcd")
    assert info == ParameterInfo("w", "uint8", (4,), 4, hashlib.sha256(b"abcd").digest())


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"P2PConfig\.port"):
        P2PConfig(port=70000)
    with pytest.raises(ValueError, match="chunk_size"):
        P2PConfig(chunk_size=2 * 1024 * 1024)
    with pytest.raises(ValueError, match="max_concurrent_downloads"):
        P2PConfig(max_concurrent_downloads=0)
    with pytest.raises(ValueError, match="read_timeout"):
        P2PConfig(read_timeout=0)


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:4000") == ("127.0.0.1", 4000)
    assert parse_address("[::1]:5") == ("::1", 5)
    for bad in ("nohost", ":80", "h:0", "h:x", "h:70000"):
        with pytest.raises(ValueError, match="not host:port"):
            parse_address(bad)
