"""The real DisTrO backend on a GPU, in process: bf16 by default, tied embeddings, and an
apply that leaves a CUDA client bit-identical to a CPU one.

The bodies are `tests.support.device_training`'s checks, which
`tests/integration/test_device_training.py` runs on the CPU in every `make test`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.cuda.gpus import needs_gpus
from tests.support.device_training import (
    check_bf16_training,
    check_cross_device_apply,
    check_tied_training,
)
from tests.support.model_families import short_directory

pytestmark = [pytest.mark.cuda, needs_gpus(1), pytest.mark.timeout(300)]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with short_directory() as directory:
        yield directory


def test_bf16_is_the_default_and_two_replicas_stay_identical() -> None:
    """`--dtype auto` on CUDA: bf16 parameters on the GPU, TF32 matmuls enabled, the loss
    falls over six steps and two clients on the GPU hold the same weights after each."""
    check_bf16_training("cuda", dtype="auto")
    assert torch.backends.cuda.matmul.allow_tf32


def test_tied_qwen2_trains_and_its_checkpoint_reloads_tied_on_the_cpu(short_tmp: Path) -> None:
    check_tied_training("cuda", short_tmp, dtype="auto")


@pytest.mark.parametrize("one_bit", [True, False], ids=["1bit", "bf16-values"])
def test_a_cuda_client_and_a_cpu_client_apply_to_the_same_weights(one_bit: bool) -> None:
    """fp32 weights, one client per device, each training on its own device (TF32 on the
    GPU): the same results give the same weights hash on CUDA and on the CPU."""
    check_cross_device_apply("cuda", "cpu", one_bit)


@needs_gpus(2)
def test_clients_on_two_gpus_apply_to_the_same_weights() -> None:
    check_cross_device_apply("cuda:0", "cuda:1", one_bit=True)
