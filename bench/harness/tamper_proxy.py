"""A test-only TCP proxy that records every byte it forwards and can flip one in flight.

`TamperProxy(target_port, flips)` listens on a free loopback port and forwards each
connection to `127.0.0.1:target_port`, frame by frame (a 4-byte big-endian length, then the
body: the framing of every link of the project, before and after the handshake). `flips`
names the frames to alter: `Flip(connection, direction, frame)` flips one bit in the middle
of the body of frame number `frame` (0: the first) that goes `direction` ("up": client →
server, "down": server → client) on connection number `connection` (0: the first accepted).
Every connection's frames are kept in `captures` as they arrived (before any flip), so a
test can check what a passive observer of the wire saw.

`start()` runs it in an event loop of its own thread (for tests driving real processes);
`serve()` runs it in the caller's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field

UP = "up"
DOWN = "down"


@dataclass(frozen=True)
class Flip:
    connection: int
    direction: str
    frame: int


@dataclass
class Capture:
    """The frames of one proxied connection, per direction, as the client and server sent
    them."""

    up: list[bytes] = field(default_factory=list)
    down: list[bytes] = field(default_factory=list)

    def after_handshake(self) -> bytes:
        """Every byte after the handshake's frames in the clear (the server's `Challenge`,
        the client's `ChallengeResponse`), both directions."""
        return b"".join(self.up[1:]) + b"".join(self.down[1:])

    def handshake(self) -> bytes:
        return b"".join(self.up[:1]) + b"".join(self.down[:1])


class TamperProxy:
    def __init__(self, target_port: int, flips: list[Flip] | tuple[Flip, ...] = ()) -> None:
        self.target_port = target_port
        self.flips = set(flips)
        self.flipped: list[Flip] = []
        self.captures: list[Capture] = []
        self.port = 0
        self._lock = threading.Lock()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # ---- running --------------------------------------------------------------------------

    async def serve(self) -> TamperProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()

    def start(self) -> TamperProxy:
        """Serve from a thread of its own (until `stop`)."""

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self.serve())
            self._ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="tamper-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the tamper proxy did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    # ---- forwarding -----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            number = len(self.captures)
            capture = Capture()
            self.captures.append(capture)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        legs = [
            asyncio.ensure_future(self._pump(number, UP, reader, up_writer, capture.up)),
            asyncio.ensure_future(self._pump(number, DOWN, up_reader, writer, capture.down)),
        ]
        await asyncio.wait(legs, return_when=asyncio.FIRST_COMPLETED)
        for leg in legs:
            leg.cancel()
        for end in (writer, up_writer):
            with contextlib.suppress(Exception):
                end.close()

    async def _pump(
        self,
        number: int,
        direction: str,
        source: asyncio.StreamReader,
        target: asyncio.StreamWriter,
        frames: list[bytes],
    ) -> None:
        index = 0
        with contextlib.suppress(asyncio.IncompleteReadError, OSError):
            while True:
                header = await source.readexactly(4)
                body = await source.readexactly(int.from_bytes(header, "big"))
                frames.append(header + body)
                flip = Flip(number, direction, index)
                if flip in self.flips and body:
                    altered = bytearray(body)
                    altered[len(altered) // 2] ^= 0x10
                    body = bytes(altered)
                    self.flipped.append(flip)
                target.write(header + body)
                await target.drain()
                index += 1
