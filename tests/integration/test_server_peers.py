"""Which P2P addresses a state broadcast carries: the epoch's members' only. A pending joiner's
address is not handed out (peers serve and dial members only, and a join flood must not grow
every broadcast) until it is a member of the next epoch; the joiner itself learns the
members' addresses."""

from __future__ import annotations

from pathlib import Path

from psyche_common.coordinator.types import RunState

from bench.harness.protocol_client import ProtocolClient, start_clients
from tests.support.server_harness import poll_until, running_server, write_state


async def test_pending_joiners_addresses_are_not_broadcast(tmp_path: Path) -> None:
    state = write_state(tmp_path / "s.toml", init_min_clients=2, epoch_time=60)
    async with running_server(state) as app:
        members = await start_clients(2, app.port, app.run_id, train_delay=0.3)
        await members[0].wait_for(lambda c: c.run_state == RunState.RoundTrain, timeout=20)
        late = await ProtocolClient(app.port, app.run_id, train_delay=0.3).connect()
        await poll_until(lambda: late.reachability, timeout=10)  # its probe has ended
        await poll_until(lambda: late.id in app.pending)
        seen = members[0].states_received
        await poll_until(lambda: members[0].states_received > seen + 1, timeout=10)
        assert late.id not in {c.id for c in app.coordinator.epoch_state.clients}
        assert late.id not in app.peers()
        assert late.id not in members[0].peers and late.id not in late.peers
        assert members[1].id in members[0].peers and members[0].id in late.peers
        for client in [*members, late]:
            await client.close()
