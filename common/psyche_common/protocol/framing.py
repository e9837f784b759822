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

Bounds are checked on the bytes before msgpack builds anything (`check_shape`: a walk over
the value's headers that skips strings and binaries by their length and stops at the first
container too long, too deep, or the value past `max_values`), so a larger frame of an
authenticated peer (a P2P link frame, which may carry a 1 MiB chunk as one msgpack bin) is
refused in microseconds too when it holds many small values.
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
    max_values: int | None = None
    """The most values in all (containers, keys and scalars), or None for no count."""


CONTROL_DECODE = DecodeBounds(max_entries=16, max_depth=2)
"""Every control message is one map of at most 16 fields holding scalars (depth 1); depth 2
leaves room for a short list."""


def encode_payload(obj: Any) -> bytes:
    """msgpack bytes of `obj` (bytes stay bin, str stays str)."""
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def decode_payload(payload: bytes, bounds: DecodeBounds | None = None) -> Any:
    """Decode exactly one msgpack value; trailing bytes or malformed data raise `BadFrame`.

    With `bounds`, the payload's shape is checked first (`check_shape`), before msgpack
    builds anything of it."""
    limits: dict[str, int] = {}
    if bounds is not None:
        check_shape(payload, bounds)
        limits = {"max_array_len": bounds.max_entries, "max_map_len": bounds.max_entries}
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True, **limits)
    except msgpack.ExtraData as exc:
        raise BadFrame("frame holds more than one msgpack value") from exc
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadFrame(f"invalid msgpack payload: {exc}") from exc
    except RecursionError as exc:
        raise BadFrame("msgpack payload nested too deeply") from exc
    return value


_FIXED_SIZES = {
    **{tag: 0 for tag in (0xC0, 0xC2, 0xC3)},  # nil, false, true
    **dict(zip(range(0xCA, 0xD4), (4, 8, 1, 2, 4, 8, 1, 2, 4, 8), strict=True)),
    **dict(zip(range(0xD4, 0xD9), (2, 3, 5, 9, 17), strict=True)),  # fixext: type + data
}
"""Header byte → bytes that follow it, for the values of a fixed size (floats, ints, fixext)."""
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC7: 1, 0xC8: 2, 0xC9: 4}
"""Header byte → width of the length that follows it (bin, str, ext; an ext adds a type byte)."""
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
"""Header byte → (width of its count, values per entry) of array16/32 and map16/32."""


def check_shape(payload: bytes, bounds: DecodeBounds) -> None:
    """Raise `BadFrame` unless the msgpack value in `payload` keeps within `bounds`, reading
    only its headers: its cost is that of the values read (at most `max_values`), whatever
    the payload's size. Truncated or malformed bytes are left to the decode to name."""
    view = memoryview(payload)
    remaining = [1]  # values still to read at each open level (the first is the payload's)
    position = count = 0
    while remaining and position < len(view):
        if remaining[-1] == 0:
            remaining.pop()
            continue
        remaining[-1] -= 1
        count += 1
        if bounds.max_values is not None and count > bounds.max_values:
            raise BadFrame(f"msgpack payload holds more than {bounds.max_values} values")
        tag = view[position]
        position += 1
        entries = per_entry = 0
        if 0x80 <= tag <= 0x9F:
            entries, per_entry = tag & 0x0F, 2 if tag <= 0x8F else 1
        elif tag in _CONTAINERS:
            width, per_entry = _CONTAINERS[tag]
            entries = int.from_bytes(view[position : position + width], "big")
            position += width
        elif 0xA0 <= tag <= 0xBF:
            position += tag & 0x1F
        elif tag in _SIZED:
            width = _SIZED[tag]
            size = int.from_bytes(view[position : position + width], "big")
            position += width + size + (1 if tag in (0xC7, 0xC8, 0xC9) else 0)
        else:
            position += _FIXED_SIZES.get(tag, 0)  # fixints (and 0xc1, which decode refuses)
        if per_entry == 0:
            continue
        if entries > bounds.max_entries:
            kind = "map" if per_entry == 2 else "array"
            raise BadFrame(
                f"msgpack {kind} of {entries} entries exceeds max_{kind}_len ({bounds.max_entries})"
            )
        if len(remaining) > bounds.max_depth:
            raise BadFrame(f"msgpack payload nested deeper than {bounds.max_depth} levels")
        remaining.append(entries * per_entry)


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
