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


def test_dense_counting_gives_what_the_sorted_scatter_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many results (coefficients filling the positions) are counted densely on the CPU; the
    positions and means are bit-identical to the sort-and-scatter path's."""
    from psyche_client.distro import aggregate as aggregate_module
    from psyche_client.distro.aggregate import aggregate_sparse

    gen = torch.Generator().manual_seed(4)
    payloads = []
    for _ in range(6):
        idx = torch.stack([torch.randperm(16, generator=gen)[:5] for _ in range(3)])
        val = torch.randn(3, 5, generator=gen) * 2.0 ** torch.randint(-20, 20, (3, 5)).float()
        payloads.append(_payload(idx.tolist(), val.tolist(), 16))
    cpu = torch.device("cpu")
    for over_all in (False, True):
        monkeypatch.setattr(aggregate_module, "_DENSE_RATIO", 0)
        sorted_pos, sorted_means = aggregate_sparse(
            payloads, ValueKind.BF16, 16, mean_over_all=over_all, device=cpu
        )
        monkeypatch.setattr(aggregate_module, "_DENSE_RATIO", 10**9)
        dense_pos, dense_means = aggregate_sparse(
            payloads, ValueKind.BF16, 16, mean_over_all=over_all, device=cpu
        )
        assert torch.equal(sorted_pos, dense_pos)
        assert torch.equal(sorted_means, dense_means)
