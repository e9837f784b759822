"""Is a joining client reachable by its peers? The server connects back and finds out.

After each `Join` the server dials the client's advertised P2P address and speaks only this
project's P2P handshake there: it waits for the listener's `Challenge`, sends a `Probe` with a
nonce of its own and checks the `Proof` that comes back (`handshake.probe_transcript`), which
must be signed by the joining client's key. The verdict is a yes or a no and nothing else:
"reachable" (the handshake succeeded with the right key) or "not reachable"; nothing the far
end sent is echoed anywhere (not to the client, not in the logs), and the server sends nothing
but the `Probe` frame, and that only to a P2P listener that opened with a valid `Challenge`. A
joiner that advertises another host's address therefore learns nothing about what listens
there. The server's own log says which step failed (connect, timeout, handshake, key), for
the operator only.

The verdict goes into every state broadcast (`CoordinatorState.unreachable`: peers do not dial
those clients, which are served over the connections they open themselves) and back to the
client (`Reachability`, with the address its connection comes from), so the client knows
whether to act as outbound-only.

A probe is bounded by `timeout` (connect and the handshake each) and reads control frames only
(`HANDSHAKE_FRAME_SIZE` bytes, bounded decode); a Join while an earlier probe of the same
client runs replaces that probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from psyche_common.protocol import (
    CONTROL_DECODE,
    HANDSHAKE_FRAME_SIZE,
    ProtocolError,
    encode_frame,
    read_frame,
    short_id,
    verify_signature,
)
from psyche_common.protocol.handshake import (
    new_challenge,
    probe_transcript,
    read_challenge,
    signed_key,
)

log = logging.getLogger("psyche.server")

PROBE_TIMEOUT = 5.0

REACHABLE_DETAIL = "a P2P listener proved this client's key at the address"
UNREACHABLE_DETAIL = "no P2P listener proved this client's key at the address"
"""The only texts a client is told (`Reachability.detail`)."""


class ProbeFailure(enum.Enum):
    """Which step of a probe failed (for the server's log only)."""

    ADDRESS = "the address is not host:port"
    CONNECT = "could not connect"
    TIMEOUT = "timed out"
    HANDSHAKE = "no P2P handshake"
    WRONG_KEY = "a P2P listener of another key answered"


@dataclass(frozen=True)
class ProbeResult:
    """Whether the client's own P2P listener answered at an address (`failure`: which step
    failed when not; never anything the far end sent)."""

    reachable: bool
    failure: ProbeFailure | None = None

    @property
    def detail(self) -> str:
        """What the client is told: one of two fixed texts."""
        return REACHABLE_DETAIL if self.reachable else UNREACHABLE_DETAIL


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) → (host, port); raises ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


async def probe_p2p(client_id: bytes, address: str, timeout: float = PROBE_TIMEOUT) -> ProbeResult:
    """Whether the P2P listener at `address` proves `client_id`'s key (each step within
    `timeout`)."""
    try:
        host, port = split_host_port(address)
    except ValueError:
        return ProbeResult(False, ProbeFailure.ADDRESS)
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return ProbeResult(False, ProbeFailure.TIMEOUT)
    except OSError:
        return ProbeResult(False, ProbeFailure.CONNECT)
    try:
        async with asyncio.timeout(timeout):
            return await _handshake(client_id, reader, writer)
    except TimeoutError:
        return ProbeResult(False, ProbeFailure.TIMEOUT)
    except (ProtocolError, OSError):
        return ProbeResult(False, ProbeFailure.HANDSHAKE)
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(1.0):
                await writer.wait_closed()


async def _handshake(
    client_id: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> ProbeResult:
    challenge = read_challenge(await read_frame(reader, HANDSHAKE_FRAME_SIZE, None, CONTROL_DECODE))
    mine = new_challenge()
    writer.write(encode_frame({"type": "Probe", "challenge": mine}))
    await writer.drain()
    reply = await read_frame(reader, HANDSHAKE_FRAME_SIZE, None, CONTROL_DECODE)
    key, signature = signed_key(reply, "Proof")
    if not verify_signature(key, probe_transcript(challenge, mine, key), signature):
        return ProbeResult(False, ProbeFailure.HANDSHAKE)
    if key != client_id:
        return ProbeResult(False, ProbeFailure.WRONG_KEY)
    return ProbeResult(True)


Probe = Callable[[bytes, str], Awaitable[ProbeResult]]
"""`(client id, address) -> verdict`."""
Report = Callable[[bytes, str, ProbeResult], None]


class ReachabilityChecker:
    """Probes clients after they join and remembers the verdicts (client id → reachable)."""

    def __init__(self, on_result: Report, probe: Probe = probe_p2p) -> None:
        self._on_result = on_result
        self._probe = probe
        self.reachable: dict[bytes, bool] = {}
        self._probes: dict[bytes, asyncio.Task[None]] = {}

    def check(self, client_id: bytes, address: str) -> None:
        """Probe `address` for `client_id` in the background (replacing a running probe)."""
        running = self._probes.pop(client_id, None)
        if running is not None:
            running.cancel()
        task = asyncio.ensure_future(self._run(client_id, address))
        self._probes[client_id] = task
        task.add_done_callback(lambda t: self._done(client_id, t))

    def _done(self, client_id: bytes, task: asyncio.Task[None]) -> None:
        if self._probes.get(client_id) is task:
            del self._probes[client_id]

    async def _run(self, client_id: bytes, address: str) -> None:
        result = await self._probe(client_id, address)
        self.reachable[client_id] = result.reachable
        verdict = "reachable" if result.reachable else "NOT reachable"
        if result.failure is not None:
            verdict += f" ({result.failure.value})"
        log.info(
            "p2p address of %s: %s",
            short_id(client_id),
            verdict,
            extra={
                "client": short_id(client_id),
                "p2p_address": address,
                "reachable": result.reachable,
            },
        )
        self._on_result(client_id, address, result)

    def unreachable(self, client_ids: Iterable[bytes]) -> list[bytes]:
        """The given clients whose last probe failed (unprobed ones count as reachable)."""
        return [cid for cid in client_ids if self.reachable.get(cid) is False]

    def forget(self, client_id: bytes) -> None:
        self.reachable.pop(client_id, None)
        running = self._probes.pop(client_id, None)
        if running is not None:
            running.cancel()

    async def close(self) -> None:
        probes = list(self._probes.values())
        self._probes.clear()
        for task in probes:
            task.cancel()
        if probes:
            await asyncio.wait(probes, timeout=2.0)
