"""Frame codec: round trips, size limits, malformed payloads, EOF and timeouts."""

from __future__ import annotations

import asyncio
import struct
import time

import msgpack
import pytest
from psyche_common.protocol import (
    CONTROL_DECODE,
    CONTROL_FRAME_SIZE,
    BadFrame,
    ConnectionClosed,
    DecodeBounds,
    FrameTooLarge,
    decode_payload,
    encode_frame,
    encode_payload,
    read_control_frame,
    read_frame,
)
from psyche_common.protocol.framing import check_shape


def reader_with(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_round_trip_keeps_bytes_and_bytes_keys() -> None:
    obj = {"type": "X", "blob": b"\x00\xff", "peers": {b"\x01" * 32: "127.0.0.1:5"}, "n": [1, 2.5]}
    reader = reader_with(encode_frame(obj) + encode_frame({"type": "Y"}))
    assert await read_frame(reader) == obj
    assert await read_frame(reader) == {"type": "Y"}
    with pytest.raises(ConnectionClosed):
        await read_frame(reader)


async def test_length_prefix_is_big_endian() -> None:
    frame = encode_frame({"a": 1})
    (size,) = struct.unpack(">I", frame[:4])
    assert size == len(frame) - 4
    assert msgpack.unpackb(frame[4:]) == {"a": 1}


async def test_oversized_frame_rejected_before_reading_payload() -> None:
    reader = reader_with(struct.pack(">I", 1_000_000), eof=False)
    with pytest.raises(FrameTooLarge) as info:
        await read_frame(reader, max_size=1000)
    assert info.value.size == 1_000_000


def test_encode_refuses_over_limit() -> None:
    with pytest.raises(FrameTooLarge):
        encode_frame({"blob": b"x" * 100}, max_size=50)


@pytest.mark.parametrize("payload", [b"\xc1", b"\x92\x01", b"\x01\x02", b"\xdb\xff\xff\xff\xff"])
async def test_bad_msgpack_is_bad_frame(payload: bytes) -> None:
    reader = reader_with(struct.pack(">I", len(payload)) + payload)
    with pytest.raises(BadFrame):
        await read_frame(reader)


async def test_truncated_payload_is_connection_closed() -> None:
    reader = reader_with(struct.pack(">I", 10) + b"abc")
    with pytest.raises(ConnectionClosed, match="3 of 10"):
        await read_frame(reader)


async def test_timeout() -> None:
    reader = reader_with(b"", eof=False)
    with pytest.raises(TimeoutError):
        await read_frame(reader, timeout=0.05)


def nested_arrays(depth: int) -> bytes:
    """`depth` arrays nested in each other, the innermost empty (one byte each)."""
    return b"\x91" * (depth - 1) + b"\x90"


def many_empty_arrays(count: int) -> bytes:
    """One array of `count` empty arrays: about 64 bytes of memory per byte when decoded."""
    return b"\xdd" + count.to_bytes(4, "big") + b"\x90" * count


@pytest.mark.parametrize(
    "payload, reason",
    [
        (many_empty_arrays(17), "exceeds max_array_len"),
        (many_empty_arrays(1 << 20), "exceeds max_array_len"),
        (nested_arrays(3), "nested deeper than 2"),
        (nested_arrays(1000), "nested deeper than 2"),
        (b"\xdf" + (1 << 20).to_bytes(4, "big"), "exceeds max_map_len"),
    ],
)
def test_control_decode_refuses_wide_or_deep_values(payload: bytes, reason: str) -> None:
    with pytest.raises(BadFrame, match=reason):
        decode_payload(payload, CONTROL_DECODE)


def test_control_decode_takes_every_control_message() -> None:
    message = {"type": "Join", "run_id": "r", "p2p_address": "1.2.3.4:5", "authorization": b"x"}
    assert decode_payload(encode_payload(message), CONTROL_DECODE) == message
    assert decode_payload(encode_payload({"batch": [1, 2]}), CONTROL_DECODE) == {"batch": [1, 2]}
    assert decode_payload(nested_arrays(2), CONTROL_DECODE) == [[]]


async def test_a_control_frame_over_its_size_is_refused_on_the_prefix() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(struct.pack(">I", CONTROL_FRAME_SIZE + 1))
    with pytest.raises(FrameTooLarge):
        await read_control_frame(reader, timeout=1, max_size=1 << 20)


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"\x9f" + b"\x91\xc0" * 15, "more than 20 values"),  # 31 values
        (b"\x81\xa1a" + nested_arrays(3), "nested deeper than 2"),
        (b"\x9f" + b"\x90" * 14 + b"\xdf" + (1 << 30).to_bytes(4, "big"), "max_map_len"),
    ],
)
def test_shape_is_checked_on_the_headers_before_any_decode(payload: bytes, reason: str) -> None:
    bounds = DecodeBounds(max_entries=16, max_depth=2, max_values=20)
    with pytest.raises(BadFrame, match=reason):
        check_shape(payload, bounds)


def test_shape_skips_strings_and_binaries_by_their_length() -> None:
    bounds = DecodeBounds(max_entries=4, max_depth=1, max_values=5)
    message = {"type": "Chunk", "data": b"\x90" * (1 << 20)}
    started = time.perf_counter()
    assert decode_payload(encode_payload(message), bounds) == message
    assert time.perf_counter() - started < 0.05  # the 1 MiB bin is one value, not a million
