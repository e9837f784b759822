"""Exact aggregation: sums that do not depend on order, scatter-mean vs mean over all."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from psyche_client.distro.aggregate import aggregate, exact_grid
from psyche_client.distro.compress import pack_bf16, pack_indices
from psyche_client.distro.result import TensorPayload
from psyche_client.distro.values import ValueKind


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(-1.0, 1.0, allow_subnormal=False), st.integers(-140, 120)),
        min_size=1,
        max_size=64,
    ),
    st.integers(0, 2**31),
)
def test_grid_values_sum_exactly_in_any_order(terms: list[tuple[float, int]], seed: int) -> None:
    values = torch.tensor([math.ldexp(m, e) for m, e in terms], dtype=torch.float64)
    values = values.to(torch.bfloat16).to(torch.float64)  # what a result can carry
    grid = exact_grid(values, len(terms)).tolist()
    exact = math.fsum(grid)
    shuffled = list(grid)
    random.Random(seed).shuffle(shuffled)
    for order in (grid, shuffled, sorted(grid)):
        total = 0.0
        for value in order:
            total += value
        assert total == exact


def test_grid_keeps_plus_minus_one_and_drops_only_far_below_the_peak() -> None:
    ones = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    assert torch.equal(exact_grid(ones, 64), ones)
    values = torch.tensor([2.0**60, 1.0, -(2.0**60), 3.0 * 2.0**20], dtype=torch.float64)
    assert exact_grid(values, 3).tolist() == [2.0**60, 0.0, -(2.0**60), 3.0 * 2.0**20]


def _payload(idx: list[list[int]], val: list[list[float]], totalk: int) -> TensorPayload:
    chunks, k = len(idx), len(idx[0])
    return TensorPayload(
        (chunks, totalk),
        totalk,
        k,
        pack_indices(torch.tensor(idx), totalk),
        pack_bf16(torch.tensor(val)),
    )


def test_mean_over_choosers_and_mean_over_all() -> None:
    payloads = [
        _payload([[0, 1], [2, 3]], [[1.0, 2.0], [4.0, 8.0]], 4),
        _payload([[1, 3], [3, 2]], [[4.0, 16.0], [2.0, 2.0]], 4),
    ]
    cpu = torch.device("cpu")
    choosers = aggregate(payloads, ValueKind.BF16, 2, 4, mean_over_all=False, device=cpu)
    assert choosers.tolist() == [[1.0, 3.0, 0.0, 16.0], [0.0, 0.0, 3.0, 5.0]]
    over_all = aggregate(payloads, ValueKind.BF16, 2, 4, mean_over_all=True, device=cpu)
    assert over_all.tolist() == [[0.5, 3.0, 0.0, 8.0], [0.0, 0.0, 3.0, 5.0]]
    with pytest.raises(ValueError, match="at least one"):
        aggregate([], ValueKind.BF16, 2, 4, mean_over_all=True, device=cpu)


def test_colliding_values_of_wide_range_give_the_same_sum_in_every_order() -> None:
    """Plain float64 gives 0 or 1 for 2**60 + 1 - 2**60 depending on the order; the grid
    makes every order agree."""
    values = [2.0**60, 1.0, -(2.0**60)]
    payloads = [_payload([[0]], [[v]], 2) for v in values]
    cpu = torch.device("cpu")
    sums = {
        tuple(
            aggregate(
                [payloads[i] for i in order], ValueKind.BF16, 1, 2, mean_over_all=True, device=cpu
            )
            .flatten()
            .tolist()
        )
        for order in ([0, 1, 2], [0, 2, 1], [1, 0, 2])
    }
    assert len(sums) == 1
