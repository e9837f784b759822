"""The server's relay between real P2P nodes on 127.0.0.1 (a real `RelayServer`).

Nodes that accept no connections (their advertised address is dead and every peer is told
they are unreachable) reach each other through pipes of the relay; a node whose direct dial
fails falls back to it; only joined clients may use it; its rate cap and counters hold; a
pipe's other end must prove the key the dialer asked for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psyche_client.p2p import P2PConfig, P2PNode
from psyche_client.p2p.connection import PeerUnavailable, dial_over
from psyche_client.p2p.dialer import RELAY_AFTER
from psyche_client.p2p.relay import RelayClient
from psyche_client.p2p.stats import TransferStats
from psyche_common.protocol import HandshakeError, Identity
from psyche_server.relay import RelayLimits, RelayServer

from tests.support.p2p import dead_address, finished, wait_until

pytestmark = pytest.mark.timeout(60)

RUN_ID = "relay-test"
FAST = P2PConfig(
    bind_host="127.0.0.1",
    connect_timeout=1.0,
    read_timeout=2.0,
    fetch_deadline=20.0,
    retry_backoff=0.01,
    announce_timeout=3.0,
    gossip_fanout=0,
)


class RelayedSwarm:
    """Nodes, one relay, one membership set shared by the nodes and the relay."""

    def __init__(self) -> None:
        self.members: set[bytes] = set()
        self.nodes: list[P2PNode] = []
        self.relays: list[RelayClient] = []
        self.unreachable: set[bytes] = set()
        self.dead = dead_address()
        self.addresses: dict[bytes, str] = {}
        self.server: RelayServer | None = None

    async def start_relay(self, **limits: Any) -> RelayServer:
        self.server = RelayServer(RUN_ID, self.members.__contains__, RelayLimits(**limits))
        await self.server.start("127.0.0.1", 0)
        return self.server

    async def add(self, *, natted: bool = False, member: bool = True, **config: Any) -> P2PNode:
        assert self.server is not None and self.server.port is not None
        identity = Identity.generate()
        if member:
            self.members.add(identity.public_key)
        node = P2PNode(
            identity,
            is_member=self.members.__contains__,
            config=dataclasses.replace(FAST, **config),
        )
        await node.start()
        relay = RelayClient(identity, "127.0.0.1", self.server.port, RUN_ID, node.accept_relayed)
        relay.start()
        node.use_relay(relay)
        self.nodes.append(node)
        self.relays.append(relay)
        self.addresses[node.peer_id] = self.dead if natted else node.address
        if natted:
            self.unreachable.add(node.peer_id)
            node.set_outbound_only(True)
        self.wire()
        await wait_until(lambda: relay.listening or not member, timeout=10)
        return node

    def wire(self) -> None:
        for node in self.nodes:
            node.set_peers(self.addresses, self.unreachable)

    async def close(self) -> None:
        for node in self.nodes:
            await node.close()
        for relay in self.relays:
            await relay.close()
        if self.server is not None:
            await self.server.close()


@pytest.fixture
async def swarm() -> AsyncIterator[RelayedSwarm]:
    s = RelayedSwarm()
    yield s
    await s.close()


async def test_two_natted_nodes_exchange_through_the_relay(swarm: RelayedSwarm) -> None:
    server = await swarm.start_relay()
    a = await swarm.add(natted=True)
    b = await swarm.add(natted=True)
    # the outbound-only nodes link up by themselves (the smaller id opens the pipe)
    await wait_until(lambda: a._pool.live(b.peer_id) is not None, timeout=10)
    await wait_until(lambda: b._pool.live(a.peer_id) is not None, timeout=10)
    assert a.link_state(b.peer_id).endswith("(relayed)")
    assert server.open_pipes == 1
    payload = os.urandom(300_000)
    assert await a.fetch_blob(b.publish_blob(payload), [b.peer_id]) == payload
    assert await b.fetch_blob(a.publish_blob(payload[::-1]), [a.peer_id]) == payload[::-1]
    report = await a.announce(finished(a, 5))
    assert report.delivered == [b.peer_id], report
    # counted per client, each way
    assert server.stats.sent[b.peer_id] >= len(payload)
    assert server.stats.received[a.peer_id] >= len(payload)
    assert server.stats.forwarded >= 2 * len(payload)
    assert server.open_pipes == 1, "one pipe per pair carries everything"


async def test_duplicate_pipes_from_simultaneous_dials_close_once_idle(
    swarm: RelayedSwarm,
) -> None:
    server = await swarm.start_relay()
    a = await swarm.add(idle_timeout=0.6)
    b = await swarm.add(idle_timeout=0.6)
    swarm.unreachable.update({a.peer_id, b.peer_id})  # reachable only through the relay
    swarm.wire()
    # both sides ask at once, each dialing its own pipe before the other's arrives
    da, db = a.publish_blob(b"a" * 100), b.publish_blob(b"b" * 100)
    await asyncio.gather(a.fetch_blob(db, [b.peer_id]), b.fetch_blob(da, [a.peer_id]))
    assert server.stats.pipes_total == 2
    a.set_outbound_only(True)
    b.set_outbound_only(True)
    # the pipe both ends use is kept (pinged); the other one closes once idle
    await wait_until(lambda: server.open_pipes == 1, timeout=5)
    await asyncio.sleep(1.5)  # past twice the idle timeout
    assert server.open_pipes == 1 and server.stats.pipes_total == 2
    assert a._pool.live(b.peer_id) is not None and b._pool.live(a.peer_id) is not None


async def test_a_failed_direct_dial_falls_back_to_the_relay(swarm: RelayedSwarm) -> None:
    await swarm.start_relay()
    a, b = await swarm.add(), await swarm.add()
    swarm.addresses[b.peer_id] = swarm.dead  # a believes b public but cannot reach it
    a.set_peers(swarm.addresses, swarm.unreachable)
    started = time.monotonic()
    data = b"behind a firewall" * 1000
    assert await a.fetch_blob(b.publish_blob(data), [b.peer_id]) == data
    assert a.link_state(b.peer_id) == "we dialed (relayed)"
    # the failure is remembered: the next link goes through the relay at once
    await a._pool.drop_peer(b.peer_id)
    assert await a.fetch_blob(b.publish_blob(b"again"), [b.peer_id]) == b"again"
    assert time.monotonic() - started < 8


async def test_a_hanging_direct_dial_is_raced_by_the_relay(swarm: RelayedSwarm) -> None:
    """b's address answers TCP but never speaks (like a peer whose packets vanish): after
    `RELAY_AFTER` s the relay joins the race and wins, long before the direct dial times out."""
    await swarm.start_relay()
    a, b = await swarm.add(), await swarm.add()
    silent = await asyncio.start_server(lambda r, w: asyncio.sleep(30), "127.0.0.1", 0)
    try:
        port = silent.sockets[0].getsockname()[1]
        swarm.addresses[b.peer_id] = f"127.0.0.1:{port}"
        a.set_peers(swarm.addresses, swarm.unreachable)
        started = time.monotonic()
        assert await a.fetch_blob(b.publish_blob(b"raced"), [b.peer_id]) == b"raced"
        elapsed = time.monotonic() - started
        assert RELAY_AFTER <= elapsed < FAST.read_timeout, elapsed
        assert a.link_state(b.peer_id) == "we dialed (relayed)"
    finally:
        silent.close()


async def test_only_joined_clients_may_use_the_relay(swarm: RelayedSwarm) -> None:
    server = await swarm.start_relay()
    member = await swarm.add(natted=True)
    stranger = await swarm.add(member=False)
    stranger_relay = swarm.relays[-1]
    await asyncio.sleep(0.3)
    assert not stranger_relay.listening, "a non-member gets no listen channel"
    with pytest.raises(PeerUnavailable, match="is not a joined client of this run"):
        await stranger_relay.open_pipe(member.peer_id)
    # and nobody gets a pipe to a non-member
    with pytest.raises(PeerUnavailable, match="is not a joined client of this run"):
        await swarm.relays[0].open_pipe(stranger.peer_id)
    assert server.stats.refused >= 2


async def test_a_member_without_a_listen_channel_cannot_be_dialed(swarm: RelayedSwarm) -> None:
    await swarm.start_relay()
    a = await swarm.add()
    ghost = Identity.generate().public_key
    swarm.members.add(ghost)
    with pytest.raises(PeerUnavailable, match="has no listen channel open"):
        await swarm.relays[0].open_pipe(ghost)
    assert a.relay is swarm.relays[0]


async def test_the_relay_paces_what_it_forwards(swarm: RelayedSwarm) -> None:
    server = await swarm.start_relay(max_mbps=4.0)  # 500 kB/s, both directions together
    a = await swarm.add(natted=True)
    b = await swarm.add(natted=True)
    await wait_until(lambda: a._pool.live(b.peer_id) is not None, timeout=10)
    payload = os.urandom(1_500_000)
    digest = b.publish_blob(payload)
    started = time.monotonic()
    assert await a.fetch_blob(digest, [b.peer_id]) == payload
    elapsed = time.monotonic() - started
    expected = (len(payload) - 256 * 1024) / 500_000  # after the pacer's burst
    assert elapsed >= 0.8 * expected, f"{elapsed:.2f}s for {len(payload)} bytes at 4 Mbit/s"
    assert server._pacer.waited > 0


async def test_a_client_that_leaves_loses_its_pipes(swarm: RelayedSwarm) -> None:
    server = await swarm.start_relay()
    a = await swarm.add(natted=True)
    b = await swarm.add(natted=True)
    await wait_until(lambda: server.open_pipes == 1, timeout=10)
    swarm.members.discard(b.peer_id)
    server.forget(b.peer_id)
    await wait_until(lambda: server.open_pipes == 0, timeout=10)
    await wait_until(lambda: a._pool.live(b.peer_id) is None, timeout=10)


async def test_the_far_end_of_a_pipe_must_prove_the_key_asked_for() -> None:
    """Whatever a relay connects us to, the P2P handshake names who answered: a pipe that
    reaches another node than the one dialed fails."""
    members: set[bytes] = set()
    other = P2PNode(Identity.generate(), is_member=members.__contains__, config=FAST)
    await other.start()
    try:
        me = Identity.generate()
        members.update({me.public_key, other.peer_id})
        wanted = Identity.generate().public_key
        reader, writer = await asyncio.open_connection("127.0.0.1", other.port)
        with pytest.raises(HandshakeError, match=r"not .* through the relay"):
            await dial_over(
                wanted,
                reader,
                writer,
                me,
                TransferStats(),
                where="peer through the relay",
                handshake_timeout=2.0,
                max_frame_size=FAST.max_frame_size,
            )
    finally:
        await other.close()


async def test_a_refused_listen_channel_retries_at_once_when_told(swarm: RelayedSwarm) -> None:
    """A client refused while not joined (e.g. by a restarted server before it joined again)
    backs off; the app's `retry_now` on its next Reachability notice reopens it at once."""
    await swarm.start_relay()
    await swarm.add(member=False)
    relay = swarm.relays[-1]
    await asyncio.sleep(3.5)  # refused at 0, ~1 and ~3 s: the next try is ~4 s away
    assert not relay.listening
    swarm.members.add(relay.identity.public_key)
    relay.retry_now()
    await wait_until(lambda: relay.listening, timeout=1.0)
