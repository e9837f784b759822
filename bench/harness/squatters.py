"""Test-only hosts that try to hold a server's connections for themselves (issue 29, findings
6 and 7), each in a thread of its own like `hostile_hosts`, until `stop()`:

- `RelayHog`: one key (a member's: `tests/e2e/relay_hog_client.py` runs it inside an attack
  client, with that client's own key) asking the relay for pipes to one victim from several
  loopback addresses at once, `DIALS_PER_SOURCE` from each, in bursts every `BURST_INTERVAL`
  seconds, each pipe it is granted held open. `granted` is the most dials one burst was
  granted, `refused` the refusals over all bursts (`reasons`: the relay's, counted). The relay
  bounds one key to `max_pipes_per_pair` (8) of a victim's incoming pipes from however many
  addresses, and never charges them to the victim's own outgoing budget.
- `DataSquatter`: `keys` throwaway identities (keys cost nothing) opening the data server's
  port from `source`, completing the run-bound handshake and then sending nothing, holding
  each connection. The data server admits only the epoch's members at the handshake and
  closes a member's connection that asks for nothing within its first-request timeout.
  `opened` counts the handshakes done, `closed_by_target` the connections the data server
  closed within `HOLD_TIMEOUT` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from psyche_common.protocol import (
    Identity,
    SecureChannel,
    connect_handshake,
    data_server_domain,
    relay_domain,
)

from bench.harness.hostile_hosts import TIMEOUT, _closed_within, _Host

DIALS_PER_SOURCE = 24
"""Dials each address of a `RelayHog` asks for in one burst (4 addresses: 96, more than a
client's 64 incoming pipes)."""
BURST_INTERVAL = 5.0
HOLD_TIMEOUT = 15.0
"""Seconds a `DataSquatter` waits for the data server to close an idle connection (its
first-request timeout is 10 s)."""


class RelayHog(_Host):
    """See the module docstring: `identity` dials `victim` through the relay on `port`."""

    def __init__(
        self,
        port: int,
        run_id: str,
        identity: Identity,
        victim: bytes,
        sources: tuple[str, ...] = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"),
    ) -> None:
        super().__init__("relay-hog", sources[0])
        self.port = port
        self.run_id = run_id
        self.identity = identity
        self.victim = victim
        self.sources = sources
        self.bursts = 0
        self.granted = 0
        self.refused = 0
        self.reasons: Counter[str] = Counter()
        self._held: list[SecureChannel] = []

    @property
    def shed(self) -> bool:
        """Whether no burst got more than one key's share of the victim's pipes (8)."""
        return self.bursts > 0 and self.granted <= 8

    async def _run(self) -> None:
        try:
            while True:
                results = await asyncio.gather(
                    *(
                        self._dial(source)
                        for source in self.sources
                        for _ in range(DIALS_PER_SOURCE)
                    )
                )
                self.bursts += 1
                self.granted = max(self.granted, sum(results))
                await asyncio.sleep(BURST_INTERVAL)
        finally:
            for channel in self._held:
                channel.abort()

    async def _dial(self, source: str) -> bool:
        """One dial from `source`; True when the relay took it (it is then held)."""
        try:
            async with asyncio.timeout(TIMEOUT):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=(source, 0)
                )
            channel = await connect_handshake(
                reader, writer, self.identity, domain=relay_domain(self.run_id), timeout=TIMEOUT
            )
        except (OSError, TimeoutError, Exception):
            self.refused += 1
            self.reasons["closed at accept"] += 1
            return False
        try:
            channel.write({"type": "RelayDial", "peer": self.victim})
            frame = await channel.read(4096, timeout=1.0)
        except TimeoutError:
            self._held.append(channel)  # pending or piped: the relay took it
            return True
        except (OSError, Exception):
            self.refused += 1
            self.reasons["closed"] += 1
            channel.abort()
            return False
        if isinstance(frame, dict) and frame.get("type") == "Rejected":
            self.refused += 1
            self.reasons[str(frame.get("reason"))[:80]] += 1
            channel.abort()
            return False
        self._held.append(channel)  # the pipe opened at once (the victim answered)
        return True


class DataSquatter(_Host):
    """See the module docstring: `keys` connections at the data server on `port`."""

    def __init__(self, port: int, run_id: str, source: str = "127.0.0.6", keys: int = 64) -> None:
        super().__init__("data-squatter", source)
        self.port = port
        self.run_id = run_id
        self.keys = keys
        self.opened = 0
        self.closed_by_target = 0

    @property
    def shed(self) -> bool:
        """Whether the data server closed every connection the host opened (and it opened
        some)."""
        return self.opened > 0 and self.closed_by_target == self.opened

    async def _run(self) -> None:
        while True:
            await asyncio.gather(*(self._squat() for _ in range(self.keys)))
            await asyncio.sleep(1.0)

    async def _squat(self) -> None:
        try:
            reader, writer = await self._open(self.port)
        except (OSError, TimeoutError):
            return
        try:
            await connect_handshake(
                reader,
                writer,
                Identity.generate(),
                domain=data_server_domain(self.run_id),
                timeout=TIMEOUT,
            )
            self.opened += 1
            if await _closed_within(reader, HOLD_TIMEOUT):
                self.closed_by_target += 1
        except (OSError, TimeoutError, Exception):
            pass  # refused before the handshake finished (a per-address cap)
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()
