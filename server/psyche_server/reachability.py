"""Is a joining client reachable by its peers? The server connects back and finds out.

After each `Join` the server dials the client's advertised P2P address and waits for the
first frame of the P2P handshake (`Challenge`: a P2P listener answers there). It then sends
nothing and closes: it has no P2P identity and needs none. The verdict goes into every state
broadcast (`CoordinatorState.unreachable`: peers do not dial those clients, which are served
over the connections they open themselves) and back to the client (`Reachability`, with the
address its connection comes from), so the client knows whether to act as outbound-only.

A probe is bounded by `timeout` (connect and first frame each); a Join while an earlier probe
of the same client runs replaces that probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from psyche_common.protocol import ProtocolError, read_frame, short_id

log = logging.getLogger("psyche.server")

PROBE_TIMEOUT = 5.0
PROBE_MAX_FRAME = 4096


@dataclass(frozen=True)
class ProbeResult:
    """Whether a P2P listener answered at an address, and what happened (for the logs)."""

    reachable: bool
    detail: str


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) → (host, port); raises ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


async def probe_p2p(address: str, timeout: float = PROBE_TIMEOUT) -> ProbeResult:
    """Connect to `address` and wait for a P2P `Challenge` (each step within `timeout`)."""
    try:
        host, port = split_host_port(address)
    except ValueError as exc:
        return ProbeResult(False, str(exc))
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return ProbeResult(False, f"connecting to {address} timed out after {timeout:g}s")
    except OSError as exc:
        return ProbeResult(False, f"cannot connect to {address}: {exc}")
    try:
        frame = await read_frame(reader, max_size=PROBE_MAX_FRAME, timeout=timeout)
    except TimeoutError:
        return ProbeResult(False, f"{address} accepted but sent nothing within {timeout:g}s")
    except (ProtocolError, OSError) as exc:
        return ProbeResult(False, f"{address} did not answer as a P2P listener: {exc}")
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(1.0):
                await writer.wait_closed()
    if isinstance(frame, dict) and frame.get("type") == "Challenge":
        return ProbeResult(True, f"a P2P listener answered at {address}")
    return ProbeResult(False, f"{address} did not answer as a P2P listener")


Probe = Callable[[str], Awaitable[ProbeResult]]
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
        result = await self._probe(address)
        self.reachable[client_id] = result.reachable
        log.info(
            "p2p address of %s: %s (%s)",
            short_id(client_id),
            "reachable" if result.reachable else "NOT reachable",
            result.detail,
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
