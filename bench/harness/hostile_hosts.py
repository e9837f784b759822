"""Test-only hostile hosts for the attack tests: work pushed on the server and on peers before
they know who is asking.

Each runs in a thread of its own from a loopback address of its own (`source`, any 127.x.y.z
on Linux), like `flood.Flood`, so the honest processes on 127.0.0.1 stay outside the
per-address caps, as distinct hosts would on the internet, until `stop()`:

- `DecodeBomber`: frames of empty msgpack arrays (about 64 bytes of memory per byte, were they
  decoded) at coordinator-protocol ports and P2P listeners: a control-sized bomb in place of
  the handshake reply (in the clear: the handshake is not over) and, with a handshake domain,
  one after an authenticated handshake (before any Join or request; sealed for the encrypted
  link, so the target decrypts it and reaches its bounded decoder), and an 8 MiB one announced
  after it (refused on its length prefix). `sent` counts bombs,
  `closed_by_target` those after which the target closed the socket within 5 s.
- `RelayExhauster`: `keys` identities that join the run (from `source`; they never train, so
  they stay pending, not epoch members) and ask the relay for pipes to every member the
  state names, over and over, while also holding idle relay connections. `dials` counts the
  dial requests, `refused` the refusals (`reasons`: the relay's, counted), `granted` the dials
  the relay took (a pending dial or a pipe), `held` and `held_refused` the idle connections and
  those the relay refused.
- `HashForger`: `keys` throwaway identities that never join (a key costs nothing), each
  opening the coordinator port, reporting one made-up weights hash for each of the next 64
  steps in `HealthCheck`s and closing, again every second. `sent` counts the reports
  delivered. Unlike the others it connects from 127.0.0.1 (its reports are what is tested,
  not a per-address cap).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from psyche_common.protocol import (
    CONTROL_FRAME_SIZE,
    HANDSHAKE_FRAME_SIZE,
    Identity,
    SecureChannel,
    connect_handshake,
    coordinator_domain,
    read_frame,
    relay_domain,
)
from psyche_common.protocol.messages import HealthCheck

from bench.harness.protocol_client import ProtocolClient

TIMEOUT = 5.0

FORGED_HASH = b"\xf0" * 32
"""The weights hash every `HashForger` key reports."""
FORGED_STEPS = 64
"""Steps (0 onwards) a forger key reports on each connection."""


def bomb_payload(size: int) -> bytes:
    """`size` bytes of one msgpack array of empty arrays (its first 64 KiB only, when larger)."""
    count = size - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x90" * min(count, 1 << 16)


def bomb_frame(size: int, channel: SecureChannel | None = None) -> bytes:
    """A frame announcing `size` payload bytes of `bomb_payload` (a target refusing it on the
    length prefix reads no more): sealed for `channel` when it is given and the bomb is
    control-sized (the target then decrypts it and hands it to its decoder), else in the
    clear."""
    if channel is not None and size <= CONTROL_FRAME_SIZE:
        return channel.seal_payload(bomb_payload(size))
    return struct.pack(">I", size) + bomb_payload(size)


class _Host:
    """A thread running `_run()` on its own event loop until `stop()`."""

    def __init__(self, name: str, source: str) -> None:
        self.source = source
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> _Host:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _main(self) -> None:
        asyncio.run(self._until_stopped(self._run()))

    async def _until_stopped(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        while not self._stop.is_set() and not task.done():
            await asyncio.sleep(0.1)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task

    async def _run(self) -> None:
        raise NotImplementedError

    async def _open(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with asyncio.timeout(TIMEOUT):
            return await asyncio.open_connection("127.0.0.1", port, local_addr=(self.source, 0))


async def _closed_within(reader: asyncio.StreamReader, timeout: float) -> bool:
    """Whether the far end closes the stream within `timeout` s (what it sends is dropped)."""
    try:
        async with asyncio.timeout(timeout):
            while await reader.read(65536):
                pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


class DecodeBomber(_Host):
    """See the module docstring; `targets` are `(port, handshake domain or None)`."""

    def __init__(self, targets: list[tuple[int, bytes | None]], source: str = "127.0.0.3") -> None:
        super().__init__("decode-bomber", source)
        self.targets = targets
        self.sent = 0
        self.closed_by_target = 0

    @property
    def shed(self) -> bool:
        """Whether the targets refused every bomb that went out (and some did)."""
        return self.sent > 0 and self.closed_by_target == self.sent

    async def _run(self) -> None:
        while True:
            for port, domain in self.targets:
                await self._bomb(port, None, HANDSHAKE_FRAME_SIZE)
                if domain is not None:
                    await self._bomb(port, domain, 8192)
                    await self._bomb(port, domain, 8 << 20)
            await asyncio.sleep(0.2)

    async def _bomb(self, port: int, domain: bytes | None, size: int) -> None:
        try:
            reader, writer = await self._open(port)
        except (OSError, TimeoutError):
            return
        try:
            channel = None
            if domain is None:
                await read_frame(reader, HANDSHAKE_FRAME_SIZE, TIMEOUT)  # the challenge
            else:
                channel = await connect_handshake(
                    reader, writer, Identity.generate(), domain=domain, timeout=TIMEOUT
                )
            writer.write(bomb_frame(size, channel))
            self.sent += 1
            with contextlib.suppress(OSError):
                await writer.drain()
            if await _closed_within(reader, TIMEOUT):
                self.closed_by_target += 1
        except (OSError, TimeoutError, Exception):
            pass  # refused before the bomb went out (a per-address cap): try again later
        finally:
            writer.transport.abort()


class RelayExhauster(_Host):
    """See the module docstring (the relay shares the coordinator `port`)."""

    def __init__(
        self, port: int, run_id: str, source: str = "127.0.0.4", keys: int = 16, held: int = 300
    ) -> None:
        super().__init__("relay-exhauster", source)
        self.port = port
        self.run_id = run_id
        self.keys = [Identity.generate() for _ in range(keys)]
        self.hold = held
        self.members: set[bytes] = set()
        self.dials = 0
        self.refused = 0
        self.granted = 0
        self.held = 0
        self.held_refused = 0
        self.reasons: Counter[str] = Counter()
        """Why dials were refused (the relay's reasons), and how many times each."""
        self._sockets: list[asyncio.StreamWriter] = []

    @property
    def shed(self) -> bool:
        """Whether the relay granted none of the host's dials (and it made some)."""
        return self.dials > 0 and self.granted == 0

    async def _run(self) -> None:
        joined = [asyncio.ensure_future(self._join(identity)) for identity in self.keys]
        try:
            while not self.members:
                await asyncio.sleep(0.2)
            await self._dial_every_member()  # first, while the relay still takes its sockets
            await self._hold_connections()
            while True:
                await self._dial_every_member()
                await asyncio.sleep(0.2)
        finally:
            for task in joined:
                task.cancel()
            for writer in self._sockets:
                writer.transport.abort()

    async def _dial_every_member(self) -> None:
        for identity in self.keys:
            for member in list(self.members):
                await self._dial(identity, member)

    async def _join(self, identity: Identity) -> None:
        """Join from `source` and follow the states (the members are their `peers`)."""
        try:
            reader, writer = await self._open(self.port)
            self._sockets.append(writer)
            domain = coordinator_domain(self.run_id)
            channel = await connect_handshake(
                reader, writer, identity, domain=domain, timeout=TIMEOUT
            )
            join = {"type": "Join", "run_id": self.run_id, "p2p_address": "127.0.0.1:9"}
            channel.write(join)
            while True:
                frame = await channel.read(1 << 26, timeout=60)
                if isinstance(frame, dict) and frame.get("type") == "CoordinatorState":
                    self.members.update(frame.get("peers", {}))
        except (OSError, TimeoutError, Exception):
            return

    async def _relay(self, identity: Identity) -> SecureChannel:
        reader, writer = await self._open(self.port)
        self._sockets.append(writer)
        domain = relay_domain(self.run_id)
        return await connect_handshake(reader, writer, identity, domain=domain, timeout=TIMEOUT)

    async def _hold_connections(self) -> None:
        """Idle relay connections (no request): what a host may hold is capped."""
        for n in range(self.hold):
            try:
                channel = await self._relay(self.keys[n % len(self.keys)])
            except (OSError, TimeoutError, Exception):
                self.held_refused += 1
                continue
            self.held += 1
            if await _closed_within(channel.reader, 0.01):
                self.held_refused += 1

    async def _dial(self, identity: Identity, member: bytes) -> None:
        try:
            channel = await self._relay(identity)
        except (OSError, Exception):
            self.refused += 1  # closed at once (a cap at accept)
            self.reasons["closed at accept"] += 1
            return
        try:
            channel.write({"type": "RelayDial", "peer": member})
            self.dials += 1
            frame = await channel.read(4096, timeout=1.0)
        except TimeoutError:
            self.granted += 1  # held by the relay (a pending dial): kept open
            return
        except (OSError, Exception):
            self.refused += 1
            self.reasons["closed"] += 1
        else:
            if isinstance(frame, dict) and frame.get("type") == "Rejected":
                self.refused += 1
                self.reasons[str(frame.get("reason"))] += 1
            else:
                self.granted += 1
                return
        self._sockets.remove(channel.writer)
        channel.abort()


class HashForger(_Host):
    """See the module docstring (the coordinator on `port`, the run `run_id`)."""

    def __init__(self, port: int, run_id: str, keys: int = 5) -> None:
        super().__init__("hash-forger", "127.0.0.1")
        self.port = port
        self.run_id = run_id
        self.keys = keys
        self.sent = 0

    @property
    def shed(self) -> bool:
        """Whether the forged reports went out (whether anyone counted them is read from the
        server's log: `attack_run`)."""
        return self.sent > 0

    async def _run(self) -> None:
        while True:
            await asyncio.gather(*(self._one() for _ in range(self.keys)))
            await asyncio.sleep(1.0)

    async def _one(self) -> None:
        forger = ProtocolClient(self.port, self.run_id, auto=False)
        with contextlib.suppress(OSError, ConnectionError, TimeoutError):
            await forger.connect(join=False)
            for step in range(FORGED_STEPS):
                await forger.send(HealthCheck(step=step, weights_hash=FORGED_HASH))
                self.sent += 1
        await forger.close()
