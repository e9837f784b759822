"""The server connects back to each joining client's P2P address (in-process server, real
sockets): a client whose listener answers is reachable; one whose address is dead is told so,
with the address the server sees it from, and its peers (once it is an epoch member) find it
in `unreachable`."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest
from psyche_client.p2p import P2PConfig, P2PNode
from psyche_common.protocol import Identity
from psyche_server.reachability import UNREACHABLE_DETAIL

from bench.harness.protocol_client import ProtocolClient
from tests.support.p2p import dead_address
from tests.support.server_harness import poll_until, running_server, write_state

pytestmark = pytest.mark.timeout(60)


async def test_reachable_and_unreachable_clients(tmp_path: Path) -> None:
    state = write_state(tmp_path / "state.toml", init_min_clients=2, warmup_time=30)
    identity = Identity.generate()
    node = P2PNode(identity, is_member=lambda _p: False, config=P2PConfig(bind_host="127.0.0.1"))
    await node.start()
    try:
        async with running_server(state) as app:
            public = ProtocolClient(
                app.port, app.run_id, identity=identity, p2p_address=node.address, auto=False
            )
            natted = ProtocolClient(app.port, app.run_id, p2p_address=dead_address(), auto=False)
            await public.connect()
            await natted.connect()
            await poll_until(lambda: public.reachability and natted.reachability, timeout=15)
            (mine,) = public.reachability
            assert mine.reachable and mine.p2p_address == node.address, mine
            assert app.relay is not None and mine.relay_port == app.relay.port
            assert mine.observed_host == "127.0.0.1"
            (theirs,) = natted.reachability
            assert not theirs.reachable and theirs.detail == UNREACHABLE_DETAIL, theirs
            # once both are members (the run's Warmup), peers learn the dead one is unreachable
            await poll_until(lambda: public.unreachable == [natted.id], timeout=10)
            assert public.peers.keys() == {public.id, natted.id}
            assert app.reachability.unreachable([public.id, natted.id]) == [natted.id]
    finally:
        await node.close()


async def test_the_relay_shares_the_coordinator_port_or_is_off(tmp_path: Path) -> None:
    """Without --relay-port the relay is on the coordinator port (the reference's data server
    listens on the coordinator port + 1); with one it has its own."""
    state = write_state(tmp_path / "state.toml", init_min_clients=3)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with socket.socket() as next_port:  # what the relay used to take: taken, it still starts
        with contextlib.suppress(OSError):  # (held by someone else: just as good)
            next_port.bind(("127.0.0.1", port + 1))
            next_port.listen(1)
        async with running_server(state, port=port) as app:
            assert app.relay is not None and app.relay.port == port == app.port
    async with running_server(state, relay_port=0) as app:
        assert app.relay is not None and app.relay.port not in (None, app.port)
    async with running_server(state, relay=None) as app:
        assert app.relay is None
        client = ProtocolClient(app.port, app.run_id, p2p_address=dead_address(), auto=False)
        await client.connect()
        await poll_until(lambda: client.reachability, timeout=15)
        assert client.reachability[0].relay_port is None
        await client.close()
