"""`Dialer`: how a node reaches a peer: directly, through the server's relay, or both raced.

* A peer the server found unreachable (it accepts no connections) is reached through the
  relay, if the server offers one; without a relay it cannot be dialed at all.
* Any other peer with a known address is dialed directly. With a relay to fall back on, the
  relay is tried as well when the direct dial has not connected within `RELAY_AFTER` seconds
  (a peer whose reachability verdict is not in yet, a firewall that drops packets): the first
  connection to complete the P2P handshake wins and the other is closed. A peer whose direct
  dial failed is reached through the relay alone for `DIRECT_RETRY` seconds.

Either way the result is a `PeerConnection` authenticated end to end by the P2P handshake
(`connection.dial_peer` / `dial_over`), and whether it is relayed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from psyche_common.protocol import Identity, ProtocolError, short_id

from .config import P2PConfig
from .connection import PeerConnection, PeerUnavailable, dial_over, dial_peer
from .relay import RelayClient
from .stats import TransferStats

log = logging.getLogger(__name__)

RELAY_AFTER = 1.0
"""Seconds a direct dial runs alone before the relay is raced against it."""
DIRECT_RETRY = 300.0
"""Seconds after a failed direct dial during which a peer is reached through the relay only."""


class Dialer:
    """Opens authenticated connections to peers (see the module docstring)."""

    def __init__(
        self,
        identity: Identity,
        config: P2PConfig,
        stats: TransferStats,
        *,
        address_of: Callable[[bytes], tuple[str, int] | None],
        is_unreachable: Callable[[bytes], bool],
    ) -> None:
        self.identity = identity
        self.config = config
        self.stats = stats
        self.relay: RelayClient | None = None
        self._address_of = address_of
        self._is_unreachable = is_unreachable
        self._direct_failed: dict[bytes, float] = {}

    async def connect(self, peer_id: bytes) -> tuple[PeerConnection, bool]:
        """An authenticated connection to `peer_id`, and whether it goes through the relay.
        Raises `PeerUnavailable` (or another `ProtocolError`) naming the peer."""
        address = None if self._is_unreachable(peer_id) else self._address_of(peer_id)
        if address is not None and self._direct_worth_trying(peer_id):
            if self.relay is None:
                return await self._direct(peer_id, address), False
            return await self._race(peer_id, address)
        if self.relay is not None:
            return await self._relayed(peer_id), True
        if self._is_unreachable(peer_id):
            raise PeerUnavailable(
                f"peer {short_id(peer_id)} accepts no connections and has none open to us "
                "(and the server offers no relay)"
            )
        raise PeerUnavailable(f"no P2P address known for peer {short_id(peer_id)}")

    def _direct_worth_trying(self, peer_id: bytes) -> bool:
        failed = self._direct_failed.get(peer_id)
        return self.relay is None or failed is None or time.monotonic() - failed > DIRECT_RETRY

    async def _race(self, peer_id: bytes, address: tuple[str, int]) -> tuple[PeerConnection, bool]:
        """The direct dial, joined by the relay after `RELAY_AFTER` s; the first wins."""
        direct = asyncio.ensure_future(self._direct(peer_id, address))
        await asyncio.wait({direct}, timeout=RELAY_AFTER)
        if direct.done():
            if direct.exception() is None:
                return direct.result(), False
            self._note_direct_failure(peer_id, direct.exception())
            return await self._relayed(peer_id), True
        relayed = asyncio.ensure_future(self._relayed(peer_id))
        attempts: dict[asyncio.Future[PeerConnection], bool] = {direct: False, relayed: True}
        winner: asyncio.Future[PeerConnection] | None = None
        try:
            pending: set[asyncio.Future[PeerConnection]] = set(attempts)
            while pending and winner is None:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                winner = next((a for a in done if a.exception() is None), None)
            if winner is None:
                raise PeerUnavailable(
                    f"cannot reach {short_id(peer_id)}: directly: {direct.exception()}; "
                    f"through the relay: {relayed.exception()}"
                )
            if winner is relayed:
                log.info(
                    "P2P: reached %s through the relay (no direct connection within %gs)",
                    short_id(peer_id),
                    RELAY_AFTER,
                )
            return winner.result(), attempts[winner]
        finally:
            if direct.done() and not direct.cancelled() and direct.exception() is not None:
                self._note_direct_failure(peer_id, direct.exception())
            for attempt in attempts:
                if attempt is not winner:
                    await _abandon(attempt)

    async def _direct(self, peer_id: bytes, address: tuple[str, int]) -> PeerConnection:
        return await dial_peer(
            peer_id,
            *address,
            self.identity,
            self.stats,
            connect_timeout=self.config.connect_timeout,
            handshake_timeout=self.config.read_timeout,
            max_frame_size=self.config.max_frame_size,
        )

    async def _relayed(self, peer_id: bytes) -> PeerConnection:
        assert self.relay is not None
        reader, writer = await self.relay.open_pipe(peer_id)
        return await dial_over(
            peer_id,
            reader,
            writer,
            self.identity,
            self.stats,
            where=f"{short_id(peer_id)} through the relay",
            handshake_timeout=self.config.read_timeout,
            max_frame_size=self.config.max_frame_size,
        )

    def _note_direct_failure(self, peer_id: bytes, exc: BaseException | None) -> None:
        if peer_id not in self._direct_failed or self._direct_worth_trying(peer_id):
            log.info("P2P: %s; reaching it through the relay", exc)
        self._direct_failed[peer_id] = time.monotonic()


async def _abandon(attempt: asyncio.Future[PeerConnection]) -> None:
    """Stop a dial that lost the race, and close its connection if it got one all the same."""
    attempt.cancel()
    try:
        conn = await attempt
    except (asyncio.CancelledError, ProtocolError, OSError, TimeoutError):
        return
    await conn.close()
