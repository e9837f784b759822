"""End-to-end: real clients train from the server's TCP data server, whose handshake names
the run (`data_server_domain(run_id)`), with identical weights on every client."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.harness.client_run import Cluster, applied_hashes, free_port, wait_for, write_state

pytestmark = pytest.mark.timeout(400)


def test_clients_train_from_the_run_bound_data_server(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 256, size=64 * 1024, dtype=np.uint16).astype("<u2").tofile(tokens / "part0.bin")
    data_toml = tmp_path / "data.toml"
    data_toml.write_text(
        f'dir = "{tokens}"\ntoken_size = "TwoBytes"\nseq_len = 32\n'
        f"shuffle_seed = {list(range(32))}\n"
    )
    data_port = free_port()
    state = write_state(
        tmp_path / "state.toml",
        init_min_clients=2,
        min_clients=2,
        total_steps=6,
        data_location=f'{{ Server = "127.0.0.1:{data_port}" }}',
    )
    cluster = Cluster(tmp_path, state)
    try:
        server = cluster.start_server("--data-config", str(data_toml))
        clients = [cluster.start_client() for _ in range(2)]
        wait_for(
            lambda: all(len(applied_hashes(p)) >= 3 for p in clients),
            300,
            "three applied steps on every client",
            cluster.diagnostics,
        )
        tables = [applied_hashes(p) for p in clients]
        common = sorted(set(tables[0]) & set(tables[1]))
        assert len(common) >= 3
        assert all(tables[0][s] == tables[1][s] for s in common)
        assert "handshake with the data server" not in server.log_path.read_text()
    finally:
        cluster.stop()
