"""The cross-rank checks of a multi-device client, on two real gloo ranks: a rank whose
weights hash or parameter shard differs is named, on every rank."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from tests.integration.parallel_ranks import run_rank

pytestmark = pytest.mark.timeout(180)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
