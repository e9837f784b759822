"""The GPU suite's in-process bodies (`tests.support.device_training`), run on the CPU.

`tests/cuda/test_cuda_training.py` runs these checks with `device="cuda"`; here the same
checks run with `device="cpu"` so their logic is exercised without a GPU, and the checks
themselves are shown to fail on weights that differ and on a loss that does not fall.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.support.device_training import (
    PairRun,
    check_bf16_training,
    check_cross_device_apply,
    check_falling_losses,
    check_identical_hashes,
    check_tied_training,
)
from tests.support.model_families import short_directory


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with short_directory() as directory:
        yield directory


def test_bf16_training_on_the_cpu() -> None:
    check_bf16_training("cpu", dtype="bf16")


def test_auto_dtype_is_not_bf16_on_the_cpu() -> None:
    with pytest.raises(AssertionError):
        check_bf16_training("cpu", dtype="auto", steps=1)  # fp32 parameters on the CPU


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_tied_training_on_the_cpu(short_tmp: Path, dtype: str) -> None:
    check_tied_training("cpu", short_tmp, dtype)  # type: ignore[arg-type]


@pytest.mark.parametrize("one_bit", [True, False], ids=["1bit", "bf16-values"])
def test_cross_device_apply_between_two_cpu_clients(one_bit: bool) -> None:
    check_cross_device_apply("cpu", "cpu", one_bit)


def test_the_checks_catch_differing_weights_and_a_flat_loss() -> None:
    same = PairRun((b"0", b"0"), [(5.5, 5.5)] * 3, [(b"1", b"1"), (b"2", b"2"), (b"3", b"3")])
    check_identical_hashes(same)
    with pytest.raises(AssertionError, match="differ after step 2"):
        check_identical_hashes(PairRun(same.initial, same.losses, [(b"1", b"1"), (b"2", b"x")]))
    with pytest.raises(AssertionError, match="unchanged"):
        check_identical_hashes(PairRun(same.initial, same.losses, [(b"1", b"1"), (b"1", b"1")]))
    with pytest.raises(AssertionError):
        check_identical_hashes(PairRun((b"0", b"9"), same.losses, same.hashes))
    falling = PairRun(same.initial, [(5.5, 5.4), (5.0, 5.0), (4.5, 4.6), (4.2, 4.3)], [])
    check_falling_losses(falling)
    with pytest.raises(AssertionError):
        check_falling_losses(same)
    with pytest.raises(AssertionError):
        check_falling_losses(PairRun(same.initial, [(5.5, 5.5), (float("nan"), 1.0)], []))
