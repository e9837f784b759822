"""The cross-rank checks of a multi-device client, on two real gloo ranks: a rank whose
weights hash or parameter shard differs is named, on every rank; and a worker started by
torchrun leaves when its rank 0 exits without ever loading the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from psyche_client.training.parallel.launch import ENV_DEVICE, release_workers
from psyche_client.training.parallel.plan import LaunchEnv

from bench.support.ports import free_port
from tests.integration.parallel_ranks import run_rank

pytestmark = pytest.mark.timeout(180)


def outcomes(scenario: str, tmp_path: Path) -> list[str]:
    mp.spawn(run_rank, args=(2, free_port(), scenario, str(tmp_path)), nprocs=2, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text())["outcome"] for r in range(2)]


def test_a_different_weights_hash_names_the_rank(tmp_path: Path) -> None:
    for outcome in outcomes("digest", tmp_path):
        assert outcome.startswith("rank 1's weights hash after a test (")
        assert "differs from rank 0's" in outcome


def test_a_corrupted_shard_names_the_rank_and_parameter(tmp_path: Path) -> None:
    for outcome in outcomes("shard", tmp_path):
        assert outcome == (
            "shards after a test: rank 1's shard of model.norm.weight differs from the "
            "parameter owner's copy"
        )


def test_worker_leaves_when_rank0_exits_without_joining() -> None:
    """torchrun's agent hosts the store; rank 0 exits (e.g. the run was already finished)
    before it loads a model, and says so at exit: the waiting worker exits with status 0."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = dict(
        os.environ,
        RANK="1",
        WORLD_SIZE="2",
        LOCAL_RANK="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.port),
        TORCHELASTIC_USE_AGENT_STORE="True",
        OMP_NUM_THREADS="1",
    )
    env[ENV_DEVICE] = "cpu"
    worker = subprocess.Popen(
        [sys.executable, "-m", "psyche_client.training.parallel.worker"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    prefixed = dist.PrefixStore("psyche-parallel", store)
    prefixed.wait(["arrived/1"], timedelta(seconds=120))  # the worker waits for rank 0 now
    assert worker.poll() is None
    release_workers(LaunchEnv(0, 2, 0, "127.0.0.1", store.port, agent_store=True))
    _, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert "rank 0 exited before it loaded the model" in stderr
