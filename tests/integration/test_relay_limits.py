"""The relay under exhaustion from one host (a real `RelayServer`, raw relay sockets from two
loopback addresses): dials still waiting for their second end count like open pipes, one
address holds few pipes to one client and few in all whatever its number of keys, a
non-member opens no pipe to a member, and every refusal is logged naming its limit; an honest
client from another address still gets its pipe."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from psyche_common.protocol import (
    Identity,
    SecureChannel,
    connect_handshake,
    relay_domain,
)
from psyche_server.relay import RelayLimits, RelayServer

from tests.support.p2p import wait_until

pytestmark = pytest.mark.timeout(60)

RUN_ID = "relay-limits"
ATTACKER_IP = "127.0.0.2"
LIMITS = RelayLimits(
    max_pipes_per_client=6,
    max_pipes_per_ip=5,
    max_pipes_per_ip_to_client=3,
    max_connections_per_ip=12,
    accept_timeout=20.0,
)


class Relay:
    def __init__(self) -> None:
        self.joined: set[bytes] = set()
        self.epoch: set[bytes] = set()
        self.server = RelayServer(
            RUN_ID, self.joined.__contains__, LIMITS, in_epoch=self.epoch.__contains__
        )
        self.sockets: list[asyncio.StreamWriter] = []

    def member(self, *, in_epoch: bool = True) -> Identity:
        identity = Identity.generate()
        self.joined.add(identity.public_key)
        if in_epoch:
            self.epoch.add(identity.public_key)
        return identity

    async def request(
        self, identity: Identity, request: dict[str, object], source: str = "127.0.0.1"
    ) -> SecureChannel:
        assert self.server.port is not None
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.server.port, local_addr=(source, 0)
        )
        self.sockets.append(writer)
        channel = await connect_handshake(
            reader, writer, identity, domain=relay_domain(RUN_ID), timeout=5
        )
        await channel.send(request)
        return channel

    async def dial(self, identity: Identity, target: bytes, source: str = "127.0.0.1") -> str:
        """ "pending" when the relay holds the dial (no answer within 0.3 s), else the reason
        of its refusal."""
        channel = await self.request(identity, {"type": "RelayDial", "peer": target}, source)
        try:
            frame = await channel.read(4096, timeout=0.3)
        except TimeoutError:
            return "pending"
        assert isinstance(frame, dict) and frame["type"] == "Rejected", frame
        return str(frame["reason"])


@pytest.fixture
async def relay() -> AsyncIterator[Relay]:
    r = Relay()
    await r.server.start("127.0.0.1", 0)
    yield r
    for writer in r.sockets:
        writer.transport.abort()
    await r.server.close()


async def test_one_host_with_many_keys_cannot_exhaust_a_victim_or_the_relay(
    relay: Relay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    victim, other = relay.member(), relay.member()
    for target in (victim, other):  # listen channels that never take a pipe: dials stay pending
        await relay.request(target, {"type": "RelayListen"})
    await wait_until(lambda: len(relay.server._listeners) == 2, timeout=5)
    keys = [relay.member() for _ in range(8)]  # eight member keys on one host
    answers = [await relay.dial(key, victim.public_key, ATTACKER_IP) for key in keys[:4]]
    assert answers[:3] == ["pending"] * 3, answers
    assert f"from {ATTACKER_IP} to" in answers[3] and "(at most 3 from one address" in answers[3]
    assert relay.server.pipes_of(victim.public_key) == 3  # pending dials count
    # the same host, with fresh keys, to another client: stopped by its per-address total
    answers = [await relay.dial(key, other.public_key, ATTACKER_IP) for key in keys[4:7]]
    assert answers[:2] == ["pending"] * 2, answers
    assert "--relay-max-pipes-per-ip 5" in answers[2], answers
    # an honest member from another host still gets its pipe to the victim
    honest = relay.member()
    assert await relay.dial(honest, victim.public_key) == "pending"
    assert relay.server.pipes_of(victim.public_key) == 4
    # a client that only joined (no epoch member) opens no pipe to a member
    joiner = relay.member(in_epoch=False)
    assert "not a member of the current epoch" in await relay.dial(joiner, victim.public_key)
    assert relay.server.quota.of_ip(ATTACKER_IP) == 5
    assert "relay: refused" in caplog.text and "--relay-max-pipes-per-ip 5" in caplog.text


async def test_one_host_holds_few_relay_connections(
    relay: Relay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    held = []
    for _ in range(LIMITS.max_connections_per_ip + 3):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", relay.server.port, local_addr=(ATTACKER_IP, 0)
        )
        relay.sockets.append(writer)
        held.append((reader, writer))
    await wait_until(lambda: relay.server.stats.refused >= 3, timeout=5)
    assert "--relay-max-connections-per-ip 12" in caplog.text
    # another address is not affected
    member = relay.member()
    await relay.request(member, {"type": "RelayListen"})
    await wait_until(lambda: member.public_key in relay.server._listeners, timeout=5)
