"""A 2-rank data-parallel client on two GPUs over NCCL against a single-GPU client.

`tests.integration.parallel_driver --device cuda` runs rank 0 of a replicated 2-rank client
(its worker rank on GPU 1, the data group on NCCL: `launch.data_backend`) next to a
single-device client on GPU 0; both train the same batches and apply the same results. On
the CPU the same driver runs over gloo in `tests/integration/test_parallel_backend.py`.
Gradients differ by float reassociation (and TF32 matmuls), so results only agree closely;
applying the same results must give bit-identical weights at every step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cuda.gpus import needs_gpus
from tests.integration.test_parallel_backend import (
    check_ends_with_single_device_weights,
    run_driver,
)

pytestmark = [pytest.mark.cuda, needs_gpus(2), pytest.mark.timeout(300)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_nccl_replicated_ranks_hold_the_single_gpus_weights(repo_root: Path, dtype: str) -> None:
    report = run_driver(
        repo_root,
        "--device",
        "cuda",
        "--ranks",
        "2",
        "--dtype",
        dtype,
        "--steps",
        "3",
        "--batch",
        "5",
        "--mbs",
        "2",
    )
    check_ends_with_single_device_weights(report)
    assert [step["tokens"] for step in report["steps"]] == [5 * 32, 5 * 32, 1 * 32]


def test_nccl_sharded_ranks_hold_the_single_gpus_weights(repo_root: Path) -> None:
    report = run_driver(
        repo_root, "--device", "cuda", "--ranks", "2", "--fsdp", "--steps", "3", "--batch", "5"
    )
    check_ends_with_single_device_weights(report)
    assert report["storage"]["shards"] <= 0.55 * report["storage"]["total"]
