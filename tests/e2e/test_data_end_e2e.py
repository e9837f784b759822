"""End-to-end: clients reading their own token files (`Local`) leave the run cleanly when the
data runs out — one message and exit status 0 each, with identical weights — instead of
logging `giving up on B[..]` and empty rounds forever."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.harness.client_run import Cluster, applied_hashes, wait_for, write_state

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # about 60 s, mostly torch start-up

SEQ_LEN = 32
BATCH = 6
STEPS_OF_DATA = 3


def test_clients_leave_with_status_0_when_their_data_runs_out(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    rng = np.random.default_rng(0)
    count = STEPS_OF_DATA * BATCH * SEQ_LEN
    rng.integers(0, 256, size=count, dtype=np.uint16).astype("<u2").tofile(tokens / "part0.bin")
    state = write_state(
        tmp_path / "state.toml",
        init_min_clients=2,
        min_clients=2,
        total_steps=1000,
        warmup_time=5,
        batch=BATCH,
        seq_len=SEQ_LEN,
        data_location=f'{{ Local = "{tokens}" }}',
    )
    cluster = Cluster(tmp_path, state)
    try:
        cluster.start_server()
        clients = [cluster.start_client() for _ in range(2)]
        wait_for(
            lambda: all(p.popen.poll() is not None for p in clients),
            240,
            "both clients to leave the run",
            cluster.diagnostics,
        )
        assert [p.popen.returncode for p in clients] == [0, 0], cluster.diagnostics()
        for proc in clients:
            trained = {e["step"] for e in proc.events("trained step") if e["batches"]}
            assert trained and max(trained) <= STEPS_OF_DATA, proc.tail()  # (a slow model load
            # may miss the first round)
            ends = [
                line
                for line in proc.lines()
                if "the training data is exhausted" in str(line.get("msg", ""))
            ]
            assert ends and "leaving the run" in ends[0]["msg"], proc.tail()
            log = proc.log_path.read_text()
            assert "client task failed" not in log and "giving up on" not in log
        tables = [applied_hashes(p) for p in clients]
        common = sorted(set(tables[0]) & set(tables[1]))
        assert common and all(tables[0][s] == tables[1][s] for s in common), tables
    finally:
        cluster.stop()
