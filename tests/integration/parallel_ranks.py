"""Two real ranks joined over gloo, for tests of the cross-rank checks (`spawn` target)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from psyche_client.distro import DistroSettings
from psyche_client.training.parallel.collectives import RankMismatch, agree
from psyche_client.training.parallel.commands import LoadModel
from psyche_client.training.parallel.launch import connect, disconnect
from psyche_client.training.parallel.plan import LaunchEnv
from psyche_client.training.parallel.sharded import ShardedEngine
from psyche_client.training.parallel.worker import exit_now
from psyche_common.config import Architecture

SETTINGS = DistroSettings(
    compression_decay=0.999, compression_topk=4, compression_chunk=16, quantize_1bit=True
)


def run_rank(rank: int, world_size: int, port: int, scenario: str, out: str) -> None:
    """Join as `rank`, run `scenario`, write what happened to `out/rank<r>.json`."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    env = LaunchEnv(rank, world_size, rank, "127.0.0.1", port)
    groups = connect(env, torch.device("cpu"), timeout=60)
    outcome = "no mismatch detected"
    try:
        if scenario == "digest":
            agree(groups, b"same" if rank != 1 else b"other", "weights hash after a test")
        elif scenario == "shard":
            load = LoadModel(
                "builtin:llama-tiny",
                None,
                None,
                SETTINGS,
                2,
                fsdp=True,
                architecture=Architecture.HF_LLAMA,
            )
            engine = ShardedEngine.load(groups, load)
            if rank == 1:
                named = dict(engine.model.module.named_parameters())
                with torch.no_grad():
                    engine.model.local(named["model.norm.weight"]).add_(1.0)
            engine.model.verify("shards after a test")
    except RankMismatch as exc:
        outcome = str(exc)
    finally:
        disconnect()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"outcome": outcome}))
    exit_now(0)  # as a real worker leaves: no interpreter finalisation under gloo's threads
