"""A real client stopped with SIGTERM or SIGINT in the middle of a run logs that it is
stopping, leaves the run (the server withdraws it at once, not after missed health checks)
and exits 0 within 10 s with a line saying it stopped."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench.harness.client_run import Cluster, Proc, applied_hashes, wait_for, write_state

pytestmark = pytest.mark.timeout(300)

STOP_WITHIN = 10.0
"""Seconds from the signal to the client's exit."""
WITHDRAWN_WITHIN = 3.0
"""Seconds from the signal to the server's withdrawal of the client."""


def _short_id(proc: Proc) -> str:
    ids = {line["client_id"] for line in proc.lines() if line.get("client_id")}
    assert len(ids) == 1, ids
    return str(ids.pop())


def _withdrawn(server: Proc, short_id: str) -> bool:
    return any(
        str(line.get("msg", "")).startswith("Withdrew") and line.get("client") == short_id
        for line in server.lines()
    )


def _stop(cluster: Cluster, proc: Proc, sig: signal.Signals) -> None:
    server = cluster.server
    assert server is not None
    short_id = _short_id(proc)
    assert not _withdrawn(server, short_id)
    sent = time.monotonic()
    proc.kill(sig)
    wait_for(
        lambda: _withdrawn(server, short_id),
        WITHDRAWN_WITHIN,
        f"the server to withdraw {proc.name}",
        cluster.diagnostics,
    )
    try:
        code = proc.popen.wait(STOP_WITHIN - (time.monotonic() - sent))
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{proc.name} still running after {STOP_WITHIN} s") from exc
    assert code == 0, cluster.diagnostics()
    messages = [str(line.get("msg")) for line in proc.lines()]
    assert f"{sig.name} received: stopping and leaving the run" in messages
    assert messages[-1] == f"stopped on {sig.name}; exiting", messages[-5:]
    assert not any("Traceback" in message for message in messages)


def test_sigterm_and_sigint_stop_a_client_cleanly(tmp_path: Path) -> None:
    cluster = Cluster(
        tmp_path,
        # witness_nodes 0: every member witnesses. With one witness a round whose witness is the
        # client just stopped has nobody to witness it, and the coordinator ends the epoch and
        # withdraws everyone ("nobody witnessed" cannot be told apart from "everyone left"), so
        # the survivor would wait for init_min_clients again instead of training on.
        write_state(
            tmp_path / "state.toml",
            init_min_clients=3,
            min_clients=1,
            total_steps=500,
            witness_nodes=0,
        ),
    )
    try:
        cluster.start_server()
        clients = [cluster.start_client(dummy_delay=0.2) for _ in range(3)]
        wait_for(
            lambda: all(len(applied_hashes(proc)) >= 2 for proc in clients),
            120,
            "the clients to train",
            cluster.diagnostics,
        )
        _stop(cluster, clients[0], signal.SIGTERM)
        _stop(cluster, clients[1], signal.SIGINT)
        # the one left trains on alone (min_clients 1)
        trained = len(applied_hashes(clients[2]))
        wait_for(
            lambda: len(applied_hashes(clients[2])) > trained + 1,
            60,
            "the last client to train on",
            cluster.diagnostics,
        )
    finally:
        cluster.stop()
