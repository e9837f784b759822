"""End-to-end: multi-device clients (`--data-parallelism 2`, with and without `--fsdp`) in real
runs next to single-device clients, and what happens when one of their ranks dies or freezes.

Every client is a real `psyche-client` process; a multi-device client starts its worker rank
itself (gloo on CPU, one torch thread per rank), or `torchrun` starts both ranks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench.harness.client_run import (
    BIN,
    Cluster,
    Proc,
    applied_hashes,
    losses,
    wait_for,
    write_state,
)

pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def cluster(tmp_path: Path):
    made: list[Cluster] = []

    def make(**state) -> Cluster:
        c = Cluster(tmp_path, write_state(tmp_path / "state.toml", **state))
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def worker_pids(proc: Proc) -> list[int]:
    """The worker ranks a multi-device client started (python ... parallel.worker)."""
    pids = []
    for pid in children(proc.popen.pid):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"psyche_client.training.parallel.worker" in command:
            pids.append(pid)
    return pids


def assert_same_hashes_every_step(procs: list[Proc], min_common: int) -> list[int]:
    tables = [applied_hashes(p) for p in procs]
    common = sorted(set.intersection(*(set(t) for t in tables)))
    assert len(common) >= min_common, f"only {len(common)} common applied steps"
    for step in common:
        assert len({t[step] for t in tables}) == 1, f"weights differ at step {step}"
    return common


def assert_loss_falls(proc: Proc, by: float) -> None:
    by_step = losses(proc)
    steps = sorted(by_step)
    first = sum(by_step[s] for s in steps[:3]) / 3
    last = sum(by_step[s] for s in steps[-3:]) / 3
    assert last < first - by, f"{proc.name}: loss {first:.3f} -> {last:.3f}"


@pytest.mark.parametrize(
    "sharded",
    [
        pytest.param(False, id="data-parallel"),
        # slow (~75 s on 2 cores); the default suite checks a sharded client against a
        # single-device one in tests/integration/test_parallel_backend.py
        pytest.param(True, id="fsdp", marks=pytest.mark.slow),
    ],
)
def test_two_rank_client_trains_with_single_device_peers(cluster, sharded: bool) -> None:
    """One 2-rank client and two 1-rank clients: identical weights hashes at every applied
    step, the loss falls on every client, and the workers exit with their client."""
    c = cluster(total_steps=10, epoch_time=600)
    c.start_server()
    extra = ["--data-parallelism", "2", *(["--fsdp"] if sharded else [])]
    multi = c.start_client(*extra)
    singles = [c.start_client() for _ in range(2)]
    clients = [multi, *singles]
    wait_for(lambda: len(worker_pids(multi)) == 1, 60, "the worker rank to start", c.diagnostics)
    workers = worker_pids(multi)
    wait_for(
        lambda: all(p.popen.poll() is not None for p in clients),
        300,
        "all clients to finish the run",
        c.diagnostics,
    )
    assert [p.popen.returncode for p in clients] == [0, 0, 0], c.diagnostics()
    common = assert_same_hashes_every_step(clients, min_common=6)
    assert common[-1] >= 9
    for proc in clients:
        assert_loss_falls(proc, by=0.2)
    assert not [pid for pid in workers if alive(pid)], "a worker rank outlived its client"


def start_pair(c: Cluster, *extra: str) -> tuple[Proc, Proc]:
    """A 2-rank client and a single-device peer, the multi-device one once its model is up."""
    c.start_server()
    multi = c.start_client("--data-parallelism", "2", *extra)
    single = c.start_client()
    wait_for(lambda: multi.events("model ready"), 240, "the 2-rank client's model", c.diagnostics)
    workers = worker_pids(multi)
    assert len(workers) == 1, workers
    return multi, single


@pytest.mark.parametrize(
    ("sig", "expected"),
    [
        (signal.SIGKILL, r"rank 1 \(pid {pid}\) was killed by SIGKILL"),
        (signal.SIGSTOP, r"rank 1 has shown no sign of life for \d+ s"),
    ],
    ids=["killed", "frozen"],
)
def test_dead_or_frozen_rank_ends_the_client(cluster, sig: int, expected: str) -> None:
    """A worker rank killed or frozen mid-run: the client exits with status 2, says which
    rank failed and how, and leaves no process behind."""
    c = cluster(total_steps=200, epoch_time=600, init_min_clients=2)
    multi, _ = start_pair(c, "--parallel-timeout", "10")
    (worker,) = worker_pids(multi)
    time.sleep(2)
    os.kill(worker, sig)
    try:
        wait_for(lambda: multi.popen.poll() is not None, 60, "the client to exit", c.diagnostics)
    finally:
        if sig == signal.SIGSTOP and alive(worker):
            os.kill(worker, signal.SIGKILL)
    assert multi.popen.returncode == 2, c.diagnostics()
    log = multi.log_path.read_text(errors="replace")
    assert re.search(expected.format(pid=worker), log), log[-3000:]
    failures = [e for e in multi.lines() if e.get("level") == "ERROR"]
    assert failures, "no error logged"
    time.sleep(0.5)
    assert not alive(worker), "the failed rank's process is still there"
    assert not children(multi.popen.pid)


def test_killed_client_takes_its_worker_along(cluster) -> None:
    """rank 0 (the client process) killed outright: its worker rank exits by itself."""
    c = cluster(total_steps=200, epoch_time=600, init_min_clients=2)
    multi, _ = start_pair(c)
    (worker,) = worker_pids(multi)
    multi.kill(signal.SIGKILL)
    multi.popen.wait(10)
    wait_for(lambda: not alive(worker), 20, "the orphaned worker rank to exit", c.diagnostics)


def test_torchrun_launched_client_trains_with_a_single_peer(cluster) -> None:
    """`torchrun --nproc-per-node 2 psyche-client train ...`: rank 0 joins the run, rank 1
    serves it; both exit 0 at the end of the run and the weights match the single peer's."""
    c = cluster(total_steps=6, epoch_time=600, init_min_clients=2)
    c.start_server()
    log = c.tmp / "torchrun.log"
    command = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(BIN / "psyche-client"),
        "train",
        "--server-addr",
        f"127.0.0.1:{c.port}",
        "--run-id",
        "e2e-run",
        "--device",
        "cpu",
    ]
    # torchrun takes `--logs` for a prefix of its own options: pass it as LOGS
    env = dict(c.env(), LOGS="json")
    popen = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    launched = Proc("torchrun", popen, log)
    c.clients.append(launched)
    single = c.start_client()
    wait_for(
        lambda: all(p.popen.poll() is not None for p in (launched, single)),
        300,
        "both clients to finish the run",
        c.diagnostics,
    )
    assert [launched.popen.returncode, single.popen.returncode] == [0, 0], c.diagnostics()
    common = assert_same_hashes_every_step([launched, single], min_common=3)
    assert common[-1] >= 5
