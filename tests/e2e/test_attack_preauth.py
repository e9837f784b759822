"""Work before authentication (real processes): a host sending decode bombs (frames of empty
msgpack arrays) at the coordinator port, the data-server port and a client's P2P listener, and
a host holding many keys that asks the relay for pipes to every member, do not stop a run
whose clients all reach each other through the relay: the bombs are refused as they arrive,
the relay grants the other host nothing, and the honest clients train to the end agreeing.

The hostile hosts use their own loopback addresses (127.0.0.3, 127.0.0.4); the honest
processes use 127.0.0.1 and advertise a dead P2P address, so the server finds them
unreachable and every link between them is a relay pipe.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from psyche_common.protocol import coordinator_domain, data_server_domain

from bench.harness.client_run import (
    Cluster,
    applied_hashes,
    finish_in_agreement,
    free_port,
    wait_for,
)
from bench.harness.client_run import write_state as write_run_state
from bench.harness.hostile_hosts import DecodeBomber, RelayExhauster

pytestmark = pytest.mark.timeout(400)

RUN_ID = "e2e-run"


def data_config(tmp: Path) -> Path:
    tokens = tmp / "tokens"
    tokens.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 256, size=64 * 1024, dtype=np.uint16).astype("<u2").tofile(tokens / "part0.bin")
    path = tmp / "data.toml"
    path.write_text(
        f'dir = "{tokens}"\ntoken_size = "TwoBytes"\nseq_len = 32\n'
        f"shuffle_seed = {list(range(32))}\n"
    )
    return path


def test_decode_bombs_and_relay_exhaustion_leave_a_relayed_run_training(tmp_path: Path) -> None:
    data_port = free_port()
    state = write_run_state(
        tmp_path / "state.toml",
        total_steps=10,
        witness_nodes=2,
        data_location=f'{{ Server = "127.0.0.1:{data_port}" }}',
    )
    c = Cluster(tmp_path, state)
    hosts: list[DecodeBomber | RelayExhauster] = []
    try:
        server = c.start_server("--data-config", str(data_config(tmp_path)))
        dead = f"127.0.0.1:{free_port()}"
        clients = [c.start_client("--advertise-addr", dead, dummy_delay=0.3) for _ in range(3)]
        targets = [
            (c.port, coordinator_domain(RUN_ID)),
            (data_port, data_server_domain(RUN_ID)),
            (clients[0].p2p_port(), None),
        ]
        bomber = DecodeBomber(targets)
        hosts.append(bomber.start())
        # once the run trains (the epoch's members are fixed), the other host's keys join:
        # pending, never members, they ask the relay for pipes to every member
        wait_for(lambda: applied_hashes(clients[0]), 240, "a first applied step", c.diagnostics)
        exhauster = RelayExhauster(c.port, RUN_ID)
        hosts.append(exhauster.start())
        finish_in_agreement(c, clients, min_common=6)
        for proc in clients:  # every result reached every client, through the relay
            applied = proc.events("applied step")
            assert applied and all(event["results"] == 3 for event in applied[1:]), applied
        assert "relay: pipe" in server.log_path.read_text()
        assert bomber.sent >= 9 and bomber.closed_by_target == bomber.sent, vars(bomber)
        assert exhauster.members and exhauster.dials > 0, vars(exhauster)
        assert exhauster.granted == 0, exhauster.reasons
        assert any("not a member of the current epoch" in r for r in exhauster.reasons)
        assert exhauster.held_refused > 0, vars(exhauster)  # --relay-max-connections-per-ip
    finally:
        for host in hosts:
            host.stop()
        c.stop()
