"""Frame codec: a 4-byte big-endian payload length, then one msgpack value.

Used on every TCP stream of the project (coordinator port, data-server port, client↔client P2P).
Reading enforces a maximum frame size *before* allocating the payload, and an optional timeout.
Errors are typed so a connection handler can log a precise reason and close only that stream.

A frame from a peer that has not proved anything yet (handshakes, the coordinator port before
a Join, data requests, relay requests) is a *control frame*: at most `CONTROL_FRAME_SIZE`
bytes, checked on the length prefix, and decoded with `CONTROL_DECODE` bounds (few entries per
map or array, shallow nesting), so its decode costs microseconds and kilobytes whatever its
bytes: nested empty arrays, which cost about 64 times their size in memory, cannot go far in
a few KiB, and msgpack's own limit of 1024 levels is never approached.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

DEFAULT_MAX_FRAME_SIZE = 8 * 1024 * 1024
"""Default largest accepted payload in bytes (8 MiB, the reference server's codec default)."""

CONTROL_FRAME_SIZE = 8192
"""The largest control frame (see the module docstring): a Join carrying the largest
authorization is about 4.5 KiB, every other control message under 1 KiB."""

_LENGTH = struct.Struct(">I")
LENGTH_PREFIX_SIZE = _LENGTH.size


class ProtocolError(Exception):
    """Base class: the peer sent something this protocol cannot accept."""


class FrameTooLarge(ProtocolError):
    """The announced (or produced) payload is larger than the allowed maximum."""

    def __init__(self, size: int, max_size: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the maximum of {max_size} bytes")
        self.size = size
        self.max_size = max_size


class BadFrame(ProtocolError):
    """The payload is not a single valid msgpack value."""


class ConnectionClosed(ProtocolError):
    """The peer closed the stream (cleanly between frames, or in the middle of one)."""


@dataclass(frozen=True)
class DecodeBounds:
    """Bounds on one decoded value beyond its byte size."""

    max_entries: int
    """The most entries of one map (pairs) or array (items)."""
    max_depth: int
    """The most nested containers (a flat map of scalars has depth 1)."""


CONTROL_DECODE = DecodeBounds(max_entries=16, max_depth=2)
"""Every control message is one map of at most 16 fields holding scalars (depth 1); depth 2
leaves room for a short list."""


def encode_payload(obj: Any) -> bytes:
    """msgpack bytes of `obj` (bytes stay bin, str stays str)."""
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def decode_payload(payload: bytes, bounds: DecodeBounds | None = None) -> Any:
    """Decode exactly one msgpack value; trailing bytes or malformed data raise `BadFrame`.

    With `bounds`, a map or array over `max_entries` is refused as msgpack reads its header
    (before anything of it is built), and a value nested deeper than `max_depth` after."""
    limits: dict[str, int] = {}
    if bounds is not None:
        limits = {"max_array_len": bounds.max_entries, "max_map_len": bounds.max_entries}
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True, **limits)
    except msgpack.ExtraData as exc:
        raise BadFrame("frame holds more than one msgpack value") from exc
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadFrame(f"invalid msgpack payload: {exc}") from exc
    except RecursionError as exc:
        raise BadFrame("msgpack payload nested too deeply") from exc
    if bounds is not None and _deeper_than(value, bounds.max_depth):
        raise BadFrame(f"msgpack payload nested deeper than {bounds.max_depth} levels")
    return value


def _deeper_than(value: object, depth: int) -> bool:
    """Whether `value` nests more than `depth` containers (a scalar nests none)."""
    if isinstance(value, dict):
        children: list[object] = [*value.keys(), *value.values()]
    elif isinstance(value, list):
        children = value
    else:
        return False
    return depth <= 0 or any(_deeper_than(child, depth - 1) for child in children)


def encode_frame(obj: Any, max_size: int | None = None) -> bytes:
    """Length prefix + msgpack payload. Raises `FrameTooLarge` when over `max_size`."""
    payload = encode_payload(obj)
    if max_size is not None and len(payload) > max_size:
        raise FrameTooLarge(len(payload), max_size)
    if len(payload) > 0xFFFFFFFF:
        raise FrameTooLarge(len(payload), 0xFFFFFFFF)
    return _LENGTH.pack(len(payload)) + payload


async def read_frame_bytes(
    reader: asyncio.StreamReader,
    max_size: int = DEFAULT_MAX_FRAME_SIZE,
    timeout: float | None = None,
) -> bytes:
    """Read one raw payload. Raises `ConnectionClosed`, `FrameTooLarge` or `TimeoutError`."""
    async with asyncio.timeout(timeout):
        try:
            header = await reader.readexactly(LENGTH_PREFIX_SIZE)
        except asyncio.IncompleteReadError as exc:
            detail = "" if not exc.partial else " in the middle of a length prefix"
            raise ConnectionClosed(f"peer closed the connection{detail}") from exc
        (size,) = _LENGTH.unpack(header)
        if size > max_size:
            raise FrameTooLarge(size, max_size)
        try:
            return await reader.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionClosed(
                f"peer closed the connection after {len(exc.partial)} of {size} payload bytes"
            ) from exc


async def read_frame(
    reader: asyncio.StreamReader,
    max_size: int = DEFAULT_MAX_FRAME_SIZE,
    timeout: float | None = None,
    bounds: DecodeBounds | None = None,
) -> Any:
    """Read and decode one frame (within `bounds`, when given). Raises `ConnectionClosed`,
    `FrameTooLarge`, `BadFrame`, or `TimeoutError` when `timeout` seconds pass first."""
    return decode_payload(await read_frame_bytes(reader, max_size, timeout), bounds)


async def read_control_frame(
    reader: asyncio.StreamReader,
    timeout: float | None = None,
    max_size: int = CONTROL_FRAME_SIZE,
) -> Any:
    """Read one control frame: at most `max_size` (≤ `CONTROL_FRAME_SIZE`) bytes, decoded
    within `CONTROL_DECODE` (see the module docstring)."""
    return await read_frame(reader, min(max_size, CONTROL_FRAME_SIZE), timeout, CONTROL_DECODE)


async def write_frame(writer: asyncio.StreamWriter, obj: Any, max_size: int | None = None) -> None:
    """Encode `obj`, write it and wait for the transport buffer to drain."""
    writer.write(encode_frame(obj, max_size))
    await writer.drain()
