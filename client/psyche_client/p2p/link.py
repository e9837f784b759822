"""`PeerLink`: one authenticated connection to a peer, carrying requests both ways.

After the handshake (`connection`) either side may open *streams* on the link, whoever dialed
it: every frame carries a stream id `sid`; the dialer numbers the streams it opens 1, 3, 5, …,
the listener 2, 4, 6, …, and `sid` 0 is the link's own (`Ping`, sent to keep an otherwise idle
link open through NAT routers). A stream is one request and its answer: the first frame on a
peer-numbered `sid` that is not open is a request, handed to `on_request(link, stream,
request)`; frames on a stream we opened are answers, queued for its reader, and frames of our
streams already finished (e.g. a late chunk after a timeout) are dropped.

Frames of different streams interleave at frame granularity (a writer lock keeps each frame
whole), so an announcement never waits behind a whole model parameter. A stream marked `bulk`
(answers that share the model with late joiners) writes after every waiting urgent frame and
passes the node's `pacing.UploadShaper` first (see `pacing`).

Reading is paced by the link's `rate.FrameRate` (when given): over its budget the next frame
is not read, let alone decrypted or decoded, until the budget refills, so TCP holds the peer
back. A frame that is not a well-formed link frame (`frames`: bounded decode, known fields)
closes the link. The link closes when
the peer closes it, on a read error, or after `idle_timeout` seconds without a frame and
without an open stream (unless `keep()` says to keep it: then it pings every third of that).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from psyche_common.protocol import ConnectionClosed, ProtocolError, short_id

from .connection import PeerConnection
from .pacing import PriorityLock, UploadShaper, limit_unsent
from .rate import FrameRate

log = logging.getLogger(__name__)

RequestHandler = Callable[["PeerLink", "Stream", dict[str, Any]], None]

_CLOSED: dict[str, Any] = {"type": "__closed__"}


class Stream:
    """One request/answer exchange on a link: `send`, `receive(timeout)`, `close`. It has the
    `peer_id` / `send` / `receive` surface of a `PeerConnection`, so `transfer` serves both.
    Set `bulk` on a stream that shares the model: its frames then yield to urgent ones."""

    def __init__(self, link: PeerLink, sid: int) -> None:
        self.link = link
        self.sid = sid
        self.peer_id = link.peer_id
        self.bulk = False
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def send(self, message: dict[str, Any]) -> None:
        await self.link.send_frame(self.sid, message, bulk=self.bulk)

    async def receive(self, timeout: float | None) -> dict[str, Any]:
        """The next frame of this stream; `TimeoutError` after `timeout` s, `ConnectionClosed`
        when the link closed."""
        async with asyncio.timeout(timeout):
            message = await self._queue.get()
        if message is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # every later receive fails the same way
            raise ConnectionClosed(f"peer {short_id(self.peer_id)} closed the connection")
        return message

    def deliver(self, message: dict[str, Any]) -> None:
        self._queue.put_nowait(message)

    def close(self) -> None:
        self.link.forget_stream(self.sid)


class PeerLink:
    """An authenticated connection to `peer_id` with streams in both directions."""

    def __init__(
        self,
        conn: PeerConnection,
        *,
        dialed: bool,
        on_request: RequestHandler,
        idle_timeout: float,
        max_streams: int,
        keep: Callable[[], bool] = lambda: False,
        relayed: bool = False,
        shaper: UploadShaper | None = None,
        frame_rate: FrameRate | None = None,
    ) -> None:
        self.conn = conn
        self.peer_id = conn.peer_id
        self.dialed = dialed
        self.relayed = relayed
        """Whether the connection is a pipe through the server's relay (else direct)."""
        self._on_request = on_request
        self._idle_timeout = idle_timeout
        self._max_streams = max_streams
        self._keep = keep
        self._next_sid = 1 if dialed else 2
        self._streams: dict[int, Stream] = {}
        self._write_lock = PriorityLock()
        self._shaper = shaper
        self._frame_rate = frame_rate
        limit_unsent(conn.writer)
        self.last_activity = time.monotonic()
        self.closed = False
        self._reader: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._refusals: set[asyncio.Future[None]] = set()

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Start reading (and pinging); the returned task ends when the link closes."""
        self._reader = asyncio.ensure_future(self._read_loop())
        self._pinger = asyncio.ensure_future(self._ping_loop())
        return self._reader

    async def close(self, *, abort: bool = False) -> None:
        """Close the connection; the reader sees the end of the stream and finishes by itself
        (it is not cancelled: an accepted link's reader is its server callback's own wait).
        `abort`: drop what is still queued for a peer that stopped reading (after a timeout
        or a protocol error) instead of waiting for it to drain."""
        self._mark_closed()
        if self._pinger is not None:
            self._pinger.cancel()
        if abort:
            self.conn.writer.transport.abort()
        else:
            self.conn.writer.close()
        reader = self._reader
        if reader is not None and reader is not asyncio.current_task():
            await asyncio.wait({reader}, timeout=2.0)  # never raises, whatever became of it
        await self.conn.close()

    @property
    def usable(self) -> bool:
        return not self.closed and self.conn.usable

    def idle_for(self) -> float:
        return 0.0 if self._streams else time.monotonic() - self.last_activity

    # ---- streams -----------------------------------------------------------------------------

    def open_stream(self) -> Stream:
        if not self.usable:
            raise ConnectionClosed(f"the connection to {short_id(self.peer_id)} is closed")
        stream = Stream(self, self._next_sid)
        self._next_sid += 2
        self._streams[stream.sid] = stream
        return stream

    def forget_stream(self, sid: int) -> None:
        self._streams.pop(sid, None)
        self.last_activity = time.monotonic()

    async def send_frame(self, sid: int, message: dict[str, Any], *, bulk: bool = False) -> None:
        """Write one frame of stream `sid`; waiting for the lock and the drain together is
        bounded by the connection's write timeout. A `bulk` frame first passes the node's
        upload shaper (outside that bound: its wait is pacing, not a stalled peer), then
        takes the lock after every waiting urgent frame."""
        if self.closed:
            raise ConnectionClosed(f"the connection to {short_id(self.peer_id)} is closed")
        if bulk and self._shaper is not None:
            data = message.get("data")
            await self._shaper.before_bulk(len(data) if isinstance(data, bytes) else 64)
        async with asyncio.timeout(self.conn.write_timeout), self._write_lock.hold(bulk=bulk):
            if self.closed or self.conn.writer.is_closing():  # closed while this frame waited
                raise ConnectionClosed(f"the connection to {short_id(self.peer_id)} is closed")
            await self.conn.send({**message, "sid": sid})
        self.last_activity = time.monotonic()

    # ---- reading -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        who = short_id(self.peer_id)
        try:
            while True:
                frame = await self.conn.receive_next(
                    self._idle_timeout / 3, self.conn.write_timeout or self._idle_timeout
                )
                if frame is None:
                    if self.idle_for() >= self._idle_timeout and not self._keep():
                        return
                    continue
                self.last_activity = time.monotonic()
                self._dispatch(frame)
                if self._frame_rate is not None:  # the next frame waits for its budget
                    delay = self._frame_rate.delay(self.last_activity)
                    if delay > 0:
                        await asyncio.sleep(delay)
        except ConnectionClosed:
            pass  # the peer closed the link: the normal end, cleaned up below
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.info("P2P connection with %s closed: %s: %s", who, type(exc).__name__, exc)
        finally:
            self._mark_closed()
            await self.conn.close()

    def _dispatch(self, frame: dict[str, Any]) -> None:
        sid = frame.pop("sid", None)
        if isinstance(sid, bool) or not isinstance(sid, int) or sid < 0:
            raise ProtocolError(f"peer {short_id(self.peer_id)} sent a frame without a valid sid")
        if sid == 0:
            return  # Ping (or any link-level frame): its arrival is all that matters
        stream = self._streams.get(sid)
        if stream is not None:
            stream.deliver(frame)
            return
        if sid % 2 == self._next_sid % 2:
            return  # an answer on a stream we gave up on (e.g. a late chunk): dropped
        # a request: the first (and only) frame a peer sends on a stream it opens. Streams
        # are not required to start in id order (concurrent requests race for the writer).
        stream = Stream(self, sid)
        if sum(1 for s in self._streams if s % 2 != self._next_sid % 2) >= self._max_streams:
            reason = f"more than {self._max_streams} requests at once on one connection"
            refusal = asyncio.ensure_future(self._refuse(stream, reason))
            self._refusals.add(refusal)
            refusal.add_done_callback(self._refusals.discard)
            return
        self._streams[sid] = stream
        self._on_request(self, stream, frame)

    async def _refuse(self, stream: Stream, reason: str) -> None:
        with contextlib.suppress(ProtocolError, OSError, TimeoutError):
            await stream.send({"type": "Error", "reason": reason})

    async def _ping_loop(self) -> None:
        interval = self._idle_timeout / 3
        with contextlib.suppress(ProtocolError, OSError, TimeoutError):
            while not self.closed:
                await asyncio.sleep(interval)
                if self._keep() and time.monotonic() - self.last_activity >= interval:
                    await self.send_frame(0, {"type": "Ping"})

    def _mark_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        for stream in list(self._streams.values()):
            stream.deliver(_CLOSED)
        self._streams.clear()
