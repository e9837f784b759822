"""Streaming a byte string over a peer connection in bounded chunks.

The serving side answers a request with `BlobHeader{size}` followed by `Chunk{data}` frames
of at most `chunk_size` bytes each, or with `NotFound{reason}` / `Error{reason}`. The receiver
checks the announced size against its limits *before* reading, bounds every chunk read by a
timeout (and, for blobs, the whole answer by a minimum average rate), hashes while it reads
(SHA-256), and never accepts more bytes than announced.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Protocol

from psyche_common.protocol import ProtocolError, short_id

from .connection import raise_if_rejected


class Channel(Protocol):
    """What carries one exchange: a stream of a link (`link.Stream`) or a raw connection."""

    peer_id: bytes

    async def send(self, message: dict[str, Any]) -> None: ...

    async def receive(self, timeout: float | None) -> dict[str, Any]: ...


class NotHeld(ProtocolError):
    """The peer does not hold the requested item (a normal answer, not a fault)."""


class NotShared(NotHeld):
    """A `GetManifest` answer: the peer holds the run's weights but shares no model yet (a
    member between its load and its next share); a manifest vote counts it as undecided."""


class RemoteError(ProtocolError):
    """The peer answered the request with an error."""


@dataclass(frozen=True)
class Received:
    """Bytes read from a chunked answer, with the SHA-256 computed while reading."""

    data: bytes
    sha256: bytes


async def send_bytes(conn: Channel, data: bytes | memoryview, chunk_size: int) -> None:
    """Answer with a header and the chunks of `data`."""
    view = memoryview(data)
    await conn.send({"type": "BlobHeader", "size": len(view)})
    for offset in range(0, len(view), chunk_size):
        await conn.send({"type": "Chunk", "data": bytes(view[offset : offset + chunk_size])})


async def receive_bytes(
    conn: Channel,
    *,
    max_size: int,
    read_timeout: float,
    expected_size: int | None = None,
    min_rate: float | None = None,
) -> Received:
    """Read one streamed answer; raises `NotHeld`, `RemoteError`, `ProtocolError` or
    `TimeoutError` (no frame within `read_timeout` seconds, or, with `min_rate`, the whole
    answer not in within `read_timeout` + size / `min_rate` seconds of its header: a peer that
    trickles its bytes cannot keep the reader waiting for ever, one chunk at a time)."""
    who = short_id(conn.peer_id)
    header = await conn.receive(read_timeout)
    raise_if_rejected(header, f"peer {who}")
    kind = header.get("type")
    if kind == "NotFound":
        raise NotHeld(f"peer {who} does not hold it: {header.get('reason')}")
    if kind == "NotShared":
        raise NotShared(f"peer {who} does not hold it: {header.get('reason')}")
    if kind == "Error":
        raise RemoteError(f"peer {who} answered with an error: {header.get('reason')}")
    if kind != "BlobHeader":
        raise ProtocolError(f"peer {who} sent {kind!r} instead of BlobHeader")
    size = header.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ProtocolError(f"peer {who} sent BlobHeader.size={size!r}")
    if size > max_size:
        raise ProtocolError(f"peer {who} offers {size} bytes, over the limit of {max_size}")
    if expected_size is not None and size != expected_size:
        raise ProtocolError(f"peer {who} offers {size} bytes, expected {expected_size}")
    budget = read_timeout + size / min_rate if min_rate else None
    ends = time.monotonic() + budget if budget is not None else None
    buffer = bytearray()  # grows with what actually arrives: a bogus size allocates nothing
    digest = hashlib.sha256()
    received = 0
    while received < size:
        left = ends - time.monotonic() if ends is not None else read_timeout
        try:
            if left <= 0:
                raise TimeoutError
            frame = await conn.receive(min(read_timeout, left))
        except TimeoutError:
            if ends is None or time.monotonic() < ends:
                raise
            raise TimeoutError(
                f"peer {who} sent {received} of {size} bytes in {budget:.1f} s, "
                f"slower than the minimum of {min_rate:.0f} B/s"
            ) from None
        data = frame.get("data")
        if frame.get("type") != "Chunk" or not isinstance(data, bytes) or not data:
            raise ProtocolError(f"peer {who} sent a malformed chunk ({frame.get('type')!r})")
        if received + len(data) > size:
            raise ProtocolError(f"peer {who} sent more than the announced {size} bytes")
        buffer += data
        digest.update(data)
        received += len(data)
    return Received(bytes(buffer), digest.digest())
