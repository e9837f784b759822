"""Frame codec: a 4-byte big-endian payload length, then one msgpack value.

Used on every TCP stream of the project (coordinator port, data-server port, client↔client P2P).
Reading enforces a maximum frame size *before* allocating the payload, and an optional timeout.
Errors are typed so a connection handler can log a precise reason and close only that stream.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack

DEFAULT_MAX_FRAME_SIZE = 8 * 1024 * 1024
"""Default largest accepted payload in bytes (8 MiB, the reference server's codec default)."""

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


def encode_payload(obj: Any) -> bytes:
    """msgpack bytes of `obj` (bytes stay bin, str stays str)."""
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def decode_payload(payload: bytes) -> Any:
    """Decode exactly one msgpack value; trailing bytes or malformed data raise `BadFrame`."""
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except msgpack.ExtraData as exc:
        raise BadFrame("frame holds more than one msgpack value") from exc
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadFrame(f"invalid msgpack payload: {exc}") from exc
    except RecursionError as exc:
        raise BadFrame("msgpack payload nested too deeply") from exc


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
) -> Any:
    """Read and decode one frame. Raises `ConnectionClosed`, `FrameTooLarge`, `BadFrame`,
    or `TimeoutError` when `timeout` seconds pass first."""
    return decode_payload(await read_frame_bytes(reader, max_size, timeout))


async def write_frame(writer: asyncio.StreamWriter, obj: Any, max_size: int | None = None) -> None:
    """Encode `obj`, write it and wait for the transport buffer to drain."""
    writer.write(encode_frame(obj, max_size))
    await writer.drain()
