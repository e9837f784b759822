"""`PeerReachability`: what the client does with the server's verdict on its P2P address.

After each Join the server connects back to the address we advertise and says whether that
worked (`Reachability`). Without inbound connections the node dials every peer itself and is
served over those links; and when the server offers a relay port, the client keeps a listen
channel there (`p2p.relay.RelayClient`), so peers that cannot connect to it reach it through
the relay, and it reaches such peers the same way.
"""

from __future__ import annotations

import asyncio
import logging

from psyche_common.protocol import Identity
from psyche_common.protocol.messages import Reachability

from psyche_client.p2p.node import P2PNode
from psyche_client.p2p.relay import RelayClient
from psyche_client.session.server_link import parse_server_addr

log = logging.getLogger("psyche.client")


class PeerReachability:
    def __init__(
        self,
        node: P2PNode,
        identity: Identity,
        server_addr: str,
        run_id: str,
        *,
        server_key: bytes | None = None,
    ) -> None:
        self.node = node
        self.server_key = server_key
        """The server's identity key its relay must prove (`--server-key`; None: any)."""
        self.identity = identity
        self.server_addr = server_addr
        self.run_id = run_id
        self.notice: Reachability | None = None
        """The server's last verdict on our P2P address (None until its probe ends)."""
        self.relay: RelayClient | None = None
        """Our use of the server's relay (None: the server offers none, or has not said)."""
        self._closing: set[asyncio.Future[None]] = set()

    def on_notice(self, notice: Reachability) -> None:
        """The server connected back to our advertised P2P address (or failed to): without
        inbound connections we dial every peer and are served over those connections."""
        self.notice = notice
        fields = {"p2p_address": notice.p2p_address, "observed_host": notice.observed_host}
        if notice.reachable:
            log.info(
                "reachable by peers at %s (the server sees us from %s)",
                notice.p2p_address,
                notice.observed_host,
                extra=fields,
            )
        else:
            log.warning(
                "NOT reachable by peers at %s (the server sees us from %s: %s): dialing every "
                "peer instead; open or forward the P2P port, or give --advertise-addr",
                notice.p2p_address,
                notice.observed_host,
                notice.detail,
                extra=fields,
            )
        self.node.set_outbound_only(not notice.reachable)
        self._use_relay(notice.relay_port)

    def _use_relay(self, port: int | None) -> None:
        """Keep a listen channel at the server's relay (on the coordinator's host). A
        restarted server may announce another port: the old relay client is replaced."""
        current = self.relay
        if current is not None and current.port == port:
            current.retry_now()  # a (re)join: the relay accepts us from now on
            return
        if current is not None:
            self._closing.add(asyncio.ensure_future(current.close()))
        self.relay = None
        if port is not None:
            host, _ = parse_server_addr(self.server_addr)
            self.relay = RelayClient(
                self.identity,
                host,
                port,
                self.run_id,
                self.node.accept_relayed,
                server_key=self.server_key,
            )
            self.relay.start()
            log.info("the server relays P2P traffic at %s:%d", host, port)
        self.node.use_relay(self.relay)

    async def aclose(self) -> None:
        if self.relay is not None:
            await self.relay.close()
        await asyncio.gather(*self._closing, return_exceptions=True)
