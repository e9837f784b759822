"""End-to-end on a GPU: a real `psyche-server` and two `psyche-client train --device cuda`
processes (`bench/harness/client_run.py`), and a CUDA client next to a CPU client.

Both clients apply every common step to the same weights hash; the checkpoint written from
the GPU reloads in transformers on the CPU with the last common step's weights. With
`--dtype fp32` on both sides, a client on the GPU and one on the CPU agree too: the DisTrO
apply is exact whatever the hardware (docs/distro.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.harness.client_run import Cluster, applied_hashes, losses, wait_for, write_state
from tests.cuda.gpus import needs_gpus

pytestmark = [pytest.mark.cuda, needs_gpus(1), pytest.mark.timeout(400)]

STEPS = 6


def run_two_clients(
    tmp_path: Path, devices: tuple[str, str], dtype: torch.dtype, *flags: str
) -> list[str]:
    """Train `STEPS` steps with one client on each of `devices` (the first writes
    checkpoints); returns the weights hash of every step both applied, after checking they
    agree, every step changed them and the checkpoint holds the last one in `dtype`."""
    state = write_state(
        tmp_path / "state.toml",
        total_steps=STEPS,
        init_min_clients=2,
        min_clients=2,
        batch=4,
        warmup_time=60,
    )
    cluster = Cluster(tmp_path, state)
    checkpoints = tmp_path / "checkpoints"
    try:
        cluster.start_server()
        clients = [
            cluster.start_client("--checkpoint-dir", str(checkpoints), *flags, device=devices[0]),
            cluster.start_client(*flags, device=devices[1]),
        ]
        wait_for(
            lambda: all(p.popen.poll() is not None for p in clients),
            300,
            "both clients to finish the run",
            cluster.diagnostics,
        )
    finally:
        cluster.stop()
    assert [p.popen.returncode for p in clients] == [0, 0], cluster.diagnostics()
    tables = [applied_hashes(p) for p in clients]
    common = sorted(set(tables[0]) & set(tables[1]))
    assert len(common) >= 3, cluster.diagnostics()  # steps 3-5 apply the results of 1-3
    for step in common:
        assert tables[0][step] == tables[1][step], f"weights differ at step {step}"
    hashes = [tables[0][step] for step in common]
    assert len(set(hashes)) == len(hashes)  # every step changed them
    for proc in clients:
        assert losses(proc), f"{proc.name} logged no loss"

    from psyche_client.training.trainer import weights_digest
    from transformers import AutoModelForCausalLM

    saved = sorted(checkpoints.glob("e2e-run-step*"))
    assert saved, f"no checkpoint in {checkpoints}"
    reloaded = AutoModelForCausalLM.from_pretrained(saved[-1], dtype=dtype)
    assert {(p.device.type, p.dtype) for p in reloaded.parameters()} == {("cpu", dtype)}
    assert weights_digest(reloaded).hex() == hashes[-1]
    return hashes


def test_two_cuda_clients_train_bf16_with_identical_hashes(tmp_path: Path) -> None:
    """No `--dtype`: bf16 is CUDA's default (the hash covers the dtype, so equal hashes with
    the bf16 checkpoint mean the clients trained bf16 weights)."""
    run_two_clients(tmp_path, ("cuda", "cuda"), torch.bfloat16)


def test_a_cuda_client_and_a_cpu_client_agree_in_fp32(tmp_path: Path) -> None:
    run_two_clients(tmp_path, ("cuda", "cpu"), torch.float32, "--dtype", "fp32")
