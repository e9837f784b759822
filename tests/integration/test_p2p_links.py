"""Links carry requests both ways (real P2P nodes on 127.0.0.1).

An outbound-only node (its advertised address is dead, and peers are told it is unreachable)
dials every peer and is served over those links: peers fetch its blobs and push it
announcements over the connection it opened. One connection per peer pair, whoever dialed;
membership is checked on every request in both directions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psyche_client.p2p import (
    FetchError,
    P2PConfig,
    P2PNode,
)
from psyche_common.protocol import Identity

from tests.support.p2p import dead_address, finished, wait_until

pytestmark = pytest.mark.timeout(60)

FAST = P2PConfig(
    bind_host="127.0.0.1",
    connect_timeout=1.0,
    read_timeout=1.0,
    fetch_deadline=10.0,
    retry_backoff=0.01,
    announce_timeout=2.0,
    gossip_fanout=0,
)


class Swarm:
    def __init__(self) -> None:
        self.members: set[bytes] = set()
        self.nodes: list[P2PNode] = []
        self.received: dict[bytes, list[Any]] = {}
        self.unreachable: set[bytes] = set()
        self.dead = dead_address()

    async def add(self, *, outbound_only: bool = False, **config: Any) -> P2PNode:
        identity = Identity.generate()
        self.members.add(identity.public_key)
        inbox = self.received.setdefault(identity.public_key, [])
        node = P2PNode(
            identity,
            is_member=self.members.__contains__,
            config=dataclasses.replace(FAST, **config),
            on_announcement=lambda v, _via: inbox.append(v.announcement),
        )
        await node.start()
        self.nodes.append(node)
        if outbound_only:
            self.unreachable.add(node.peer_id)
            node.set_outbound_only(True)
        self.wire()
        return node

    def book(self) -> dict[bytes, str]:
        """Every node's address, except the outbound-only ones': a dead port (nobody may
        reach them by dialing)."""
        return {
            n.peer_id: self.dead if n.peer_id in self.unreachable else n.address for n in self.nodes
        }

    def wire(self) -> None:
        for node in self.nodes:
            node.set_peers(self.book(), self.unreachable)

    async def close(self) -> None:
        for node in self.nodes:
            await node.close()


@pytest.fixture
async def swarm() -> AsyncIterator[Swarm]:
    s = Swarm()
    yield s
    await s.close()


async def test_an_outbound_only_node_is_served_over_the_links_it_opened(swarm: Swarm) -> None:
    public = [await swarm.add(), await swarm.add()]
    natted = await swarm.add(outbound_only=True)
    await wait_until(lambda: len(natted.connected_peers()) == 2)
    # its result is fetched from it over the connection it opened
    digest = natted.publish_blob(b"natted result" * 100)
    for node in public:
        assert await node.fetch_blob(digest, [natted.peer_id]) == b"natted result" * 100
    # announcements are pushed to it over that connection
    report = await public[0].announce(finished(public[0], 3))
    assert sorted(report.delivered) == sorted([public[1].peer_id, natted.peer_id]), report
    assert [a.step for a in swarm.received[natted.peer_id]] == [3]
    # and it fetches and announces over the same connections
    theirs = public[1].publish_blob(b"public result")
    assert await natted.fetch_blob(theirs, [public[1].peer_id]) == b"public result"
    report = await natted.announce(finished(natted, 4))
    assert sorted(report.delivered) == sorted(n.peer_id for n in public)
    # one connection per pair: the natted node was dialed by nobody, and the three pairs
    # (natted-p0, natted-p1, p0-p1) hold three connections in all
    assert len(natted.inbound.conns) == 0
    for node in public:
        theirs_link, mine_link = node._pool.live(natted.peer_id), natted._pool.live(node.peer_id)
        assert theirs_link is not None and not theirs_link.dialed
        assert mine_link is not None and mine_link.dialed
    assert sum(len(n.inbound.conns) for n in public) == 3
    # what the dashboard shows per peer
    assert public[0].link_state(natted.peer_id) == "they dialed"
    assert natted.link_state(public[0].peer_id) == "we dialed"
    assert not public[0].is_reachable(natted.peer_id) and natted.is_reachable(public[0].peer_id)


async def test_one_connection_carries_requests_both_ways(swarm: Swarm) -> None:
    a, b = await swarm.add(), await swarm.add()
    digest = b.publish_blob(b"from b")
    assert await a.fetch_blob(digest, [b.peer_id]) == b"from b"  # a dials b
    # b now asks a over the connection a opened, even with a's address gone
    b.set_peers({a.peer_id: swarm.dead})
    assert await b.fetch_blob(a.publish_blob(b"from a"), [a.peer_id]) == b"from a"
    assert len(a.inbound.conns) == 0 and len(b.inbound.conns) == 1
    # b has a latency for a although b never dialed it (fetches order candidates by it)
    assert a.peer_id in b.health.latency


async def test_simultaneous_dials_converge_on_one_link(swarm: Swarm) -> None:
    a, b = await swarm.add(), await swarm.add()
    da, db = a.publish_blob(b"a" * 10), b.publish_blob(b"b" * 10)
    await asyncio.gather(b.fetch_blob(da, [a.peer_id]), a.fetch_blob(db, [b.peer_id]))
    link_a, link_b = a._pool.live(b.peer_id), b._pool.live(a.peer_id)
    assert link_a is not None and link_b is not None
    # both ends use the link dialed by the smaller id
    smaller_dialed = a.peer_id < b.peer_id
    assert link_a.dialed == smaller_dialed and link_b.dialed == (not smaller_dialed)


async def test_an_unreachable_peer_without_a_link_fails_at_once(swarm: Swarm) -> None:
    public = await swarm.add()
    ghost = Identity.generate().public_key
    swarm.members.add(ghost)
    swarm.unreachable.add(ghost)
    public.set_peers({ghost: dead_address()}, [ghost])
    started = time.monotonic()
    with pytest.raises(FetchError, match="accepts no connections and has none open to us"):
        await public.fetch_blob(b"h" * 32, [ghost])
    assert time.monotonic() - started < 0.5  # no connect attempt at all


async def test_the_dialer_checks_membership_of_requests_from_the_listener(swarm: Swarm) -> None:
    a, b = await swarm.add(), await swarm.add()
    assert await a.fetch_blob(b.publish_blob(b"x"), [b.peer_id]) == b"x"
    b.set_peers({a.peer_id: swarm.dead})
    swarm.members.discard(b.peer_id)  # b leaves the epoch (as every node sees it)
    with pytest.raises(FetchError, match="no longer a member"):
        await b.fetch_blob(a.publish_blob(b"y"), [a.peer_id])


async def test_outbound_only_links_are_kept_open_past_the_idle_timeout(swarm: Swarm) -> None:
    public = await swarm.add(idle_timeout=0.6)
    natted = await swarm.add(outbound_only=True, idle_timeout=0.6)
    other = await swarm.add(idle_timeout=0.6)
    await wait_until(lambda: len(natted.connected_peers()) == 2)
    await other.fetch_blob(public.publish_blob(b"p"), [public.peer_id])  # an ordinary link
    await asyncio.sleep(1.5)  # over twice the idle timeout
    assert public._pool.live(natted.peer_id) is not None, "the pinged link stayed open"
    assert other._pool.live(public.peer_id) is None, "the idle ordinary link closed"
    digest = natted.publish_blob(b"still here")
    assert await public.fetch_blob(digest, [natted.peer_id]) == b"still here"


async def test_a_dropped_link_is_dialed_again_by_the_outbound_only_node(swarm: Swarm) -> None:
    public = await swarm.add()
    natted = await swarm.add(outbound_only=True)
    await wait_until(lambda: public._pool.live(natted.peer_id) is not None)
    link = public._pool.live(natted.peer_id)
    assert link is not None
    await link.close()  # e.g. the NAT router forgot the mapping
    await wait_until(lambda: public._pool.live(natted.peer_id) is None)
    # the natted node notices and dials again (by itself: no new coordinator state needed)
    await wait_until(lambda: public._pool.live(natted.peer_id) is not None, timeout=5)
    digest = natted.publish_blob(b"again")
    assert await public.fetch_blob(digest, [natted.peer_id]) == b"again"


async def test_a_late_link_catches_up_on_recent_announcements(swarm: Swarm) -> None:
    """Announcements pushed while a peer had no link to us reach it when its link comes up
    (a NATted client learns it is unreachable only after its first round has begun)."""
    public = [await swarm.add(), await swarm.add()]
    natted = await swarm.add()
    swarm.unreachable.add(natted.peer_id)
    swarm.wire()  # nobody may dial it, and it has not dialed anyone yet
    early = await public[0].announce(finished(public[0], 5))
    assert natted.peer_id in early.failed  # it could not be told
    natted.set_outbound_only(True)  # the server's verdict arrives: it dials every peer
    await wait_until(lambda: [a.step for a in swarm.received[natted.peer_id]] == [5])
    # what is forgotten with the step's blobs is not pushed any more
    public[0].forget_before(6)
    assert len(public[0].recent) == 0


async def test_a_member_linked_to_us_gets_pushes_before_its_address_is_known(
    swarm: Swarm,
) -> None:
    """The server hands out a joiner's address only after its probe; meanwhile the joiner may
    have dialed us already, and our announcements still reach it over that link."""
    a, b = await swarm.add(), await swarm.add()
    assert await b.fetch_blob(a.publish_blob(b"x"), [a.peer_id]) == b"x"  # b dials a
    a.set_peers({})  # a's address book does not have b yet
    report = await a.announce(finished(a, 7))
    assert report.delivered == [b.peer_id], report
    assert [x.step for x in swarm.received[b.peer_id]] == [7]
    swarm.members.discard(b.peer_id)  # a linked non-member gets nothing
    report = await a.announce(finished(a, 8))
    assert report.delivered == [] and report.failed == {}, report
