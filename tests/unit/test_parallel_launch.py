"""Which device and process-group backend each rank of a multi-device client gets."""

from __future__ import annotations

import pytest
import torch
from psyche_client.training.model.device import DeviceError
from psyche_client.training.parallel.launch import data_backend, rank_device


def test_the_data_group_follows_the_device() -> None:
    """NCCL for CUDA ranks (the GPU suite's 2-rank run uses it), gloo for CPU ranks."""
    assert data_backend(torch.device("cuda", 1)) == "nccl"
    assert data_backend(torch.device("cuda")) == "nccl"
    assert data_backend(torch.device("cpu")) == "gloo"


def test_cpu_ranks_all_use_the_cpu() -> None:
    assert [rank_device("cpu", rank, 2) for rank in (0, 1)] == [torch.device("cpu")] * 2


def test_one_named_gpu_for_several_ranks_is_refused() -> None:
    with pytest.raises(DeviceError, match="use --device cuda"):
        rank_device("cuda:0", 0, 2)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_cuda_ranks_without_a_gpu_are_refused() -> None:
    with pytest.raises(DeviceError):
        rank_device("cuda", 0, 2)
