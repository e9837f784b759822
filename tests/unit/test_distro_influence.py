"""Bounded influence of bf16 / 2-bit results: per-tensor normalisation before averaging.

A trainer sending finite but huge values must not decide more than its fair share of a
weight's update signs, and colluders must not be able to make the update NaN or infinite.
"""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
import torch
from psyche_client.distro import DistroOptimizer, DistroResult, DistroSettings
from psyche_client.distro.compress import pack_bf16
from psyche_client.distro.influence import common_scale, influence_scales, value_rms
from psyche_client.distro.result import TensorPayload
from psyche_client.distro.sparseloco import SparseLocoOptimizer, SparseLocoSettings
from psyche_client.distro.values import ValueKind, quantize
from psyche_common.batch_id import BatchId

BF16 = DistroSettings(
    compression_decay=0.999, compression_topk=8, compression_chunk=64, quantize_1bit=False
)
TWO_BIT = dataclasses.replace(BF16, quantize_2bit=True)
BF16_MAX = float(torch.finfo(torch.bfloat16).max)


class OneWeight(torch.nn.Module):
    """A single 128 x 128 weight: 4 tiles of 64 x 64, 32 transmitted coefficients."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(128, 128, generator=gen))


def honest_results(settings: DistroSettings, count: int) -> list[DistroResult]:
    results = []
    for r in range(count):
        model = OneWeight()
        optimizer = DistroOptimizer(model.named_parameters(), settings)
        gen = torch.Generator().manual_seed(100 + r)
        model.w.grad = torch.randn(128, 128, generator=gen) * (1.0 + r)  # unequal norms
        results.append(optimizer.generate(0.01, 5, BatchId(8 * r, 8 * r + 7), 0).transmit)
    return results


def with_values(result: DistroResult, values: torch.Tensor, batch: BatchId) -> DistroResult:
    """`result`'s coefficients (same indices) carrying `values` as bf16."""
    payload = result.tensors[0]
    forged = TensorPayload(
        payload.xshape, payload.totalk, payload.k, payload.idx, pack_bf16(values)
    )
    return DistroResult(result.step, batch, 0, result.value_kind, (forged,))


def update_signs(settings: DistroSettings, results: list[DistroResult]) -> torch.Tensor:
    """sign of the weight change when `results` are applied (lr 1)."""
    model = OneWeight()
    before = model.w.detach().clone()
    DistroOptimizer(model.named_parameters(), settings).apply(results, 1.0)
    change = model.w.detach() - before
    assert torch.isfinite(change).all()
    return torch.sign(change)


def agreement(signs: torch.Tensor, own: torch.Tensor) -> float:
    return float((signs == own).double().mean())


# ---- the pure functions --------------------------------------------------------------------


def test_rms_is_exact_and_refuses_non_finite_values() -> None:
    values = np.array([[3.0, -4.0], [0.0, 0.0]])
    assert value_rms(values) == math.sqrt(25.0 / 4)
    assert value_rms(np.zeros((0, 2))) == 0.0
    assert value_rms(np.array([BF16_MAX, BF16_MAX])) == BF16_MAX  # squares stay finite
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="NaN or infinity"):
            value_rms(np.array([1.0, bad]))


def test_common_scale_is_the_lower_median() -> None:
    assert common_scale([5.0]) == 5.0
    assert common_scale([1e30, 1.0]) == 1.0
    assert common_scale([2.0, 1e30, 1.0, 3.0]) == 2.0  # one huge of 4
    assert common_scale([1e30, 2.0, 1e38, 1.0]) == 2.0  # two huge of 4
    with pytest.raises(ValueError):
        common_scale([])


def test_scales_bring_every_result_to_the_common_rms() -> None:
    rms = [1.0, 4.0, 1e38, 0.0]
    scales = influence_scales(rms)
    assert scales == [1.0, 0.25, 1.0 / 1e38, 0.0]
    assert [r * s for r, s in zip(rms, scales, strict=True)][:3] == pytest.approx([1.0] * 3)


def test_clipped_scales_only_bring_results_down_to_the_common_rms() -> None:
    rms = [0.5, 1.0, 4.0, 0.0]  # lower median 0.5
    assert influence_scales(rms) == [1.0, 0.5, 0.125, 0.0]
    assert influence_scales(rms, clip=True) == [1.0, 0.5, 0.125, 0.0]
    rms = [0.25, 1.0, 4.0]  # lower median 1.0: the small result keeps its size when clipped
    assert influence_scales(rms) == [4.0, 1.0, 0.25]
    assert influence_scales(rms, clip=True) == [1.0, 1.0, 0.25]


# ---- attacks -------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [BF16, TWO_BIT], ids=["bf16", "2bit"])
def test_one_huge_result_of_four_decides_no_more_than_its_share_of_signs(
    settings: DistroSettings,
) -> None:
    honest = honest_results(BF16, 4)
    rng = torch.Generator().manual_seed(7)
    # the attacker: its honest coefficients with random signs and huge (finite) magnitudes
    flips = torch.where(torch.rand(4, 8, generator=rng) < 0.5, -1.0, 1.0)
    huge = torch.full((4, 8), 1e30) * flips
    attacker = with_values(honest[3], huge, BatchId(24, 31))
    results = [*honest[:3], attacker]
    if settings is TWO_BIT:
        results = [_as_two_bit(r) for r in results]
    combined = update_signs(settings, results)
    shares = [agreement(combined, update_signs(settings, [r])) for r in results]
    attacker_share = shares[3]
    # without the normalisation the attacker decided every sign (share 1.0); an equal
    # partner of 4 independent ones agrees with about 2/3 of the signs
    assert attacker_share < 0.8, shares
    assert attacker_share <= max(shares[:3]) + 0.1, shares


def test_two_colluders_cannot_make_the_update_non_finite_or_freeze_weights() -> None:
    honest = honest_results(BF16, 4)
    top = torch.full((4, 8), BF16_MAX)
    colluders = [
        with_values(honest[2], top, BatchId(16, 23)),
        with_values(honest[3], top, BatchId(24, 31)),
    ]
    results = [*honest[:2], *colluders]
    model = OneWeight()
    before = model.w.detach().clone()
    DistroOptimizer(model.named_parameters(), BF16).apply(results, 0.5)
    change = model.w.detach() - before
    assert torch.isfinite(model.w).all()
    assert float((change != 0).double().mean()) > 0.99  # every weight still moves
    combined = torch.sign(change)
    colluder_share = agreement(combined, update_signs(BF16, colluders))
    assert colluder_share < 0.9


def test_sparseloco_update_is_bounded_by_the_typical_result() -> None:
    """SparseLoCo applies magnitudes: a huge result must not blow up the weights."""
    settings = SparseLocoSettings(
        inner_steps=1, outer_lr=1.0, compression_decay=0.9, compression_topk=8,
        compression_chunk=64, quantize_2bit=False, weight_decay=0.0, clip_grad_norm=None,
    )  # fmt: skip
    honest = honest_results(BF16, 4)
    attacker = with_values(honest[3], torch.full((4, 8), 1e30), BatchId(24, 31))

    def change(results: list[DistroResult]) -> torch.Tensor:
        model = OneWeight()
        before = model.w.detach().clone()
        SparseLocoOptimizer(model.named_parameters(), settings).apply(results, 0.0)
        return model.w.detach() - before

    clean = change(honest)
    attacked = change([*honest[:3], attacker])
    assert torch.isfinite(attacked).all()
    assert float(attacked.norm()) < 3.0 * float(clean.norm())


def test_bounded_apply_is_bit_identical_in_any_arrival_order() -> None:
    honest = honest_results(BF16, 4)
    results = [*honest[:3], with_values(honest[3], torch.full((4, 8), 1e30), BatchId(24, 31))]
    reference = None
    for seed in range(4):
        arrival = list(results)
        random.Random(seed).shuffle(arrival)
        model = OneWeight()
        DistroOptimizer(model.named_parameters(), BF16).apply(arrival, 0.1)
        if reference is None:
            reference = model.w.detach().clone()
        assert torch.equal(model.w, reference)


def _as_two_bit(result: DistroResult) -> DistroResult:
    """The same coefficients re-encoded as 2-bit values (scale = max |v| per chunk)."""
    payload = result.tensors[0]
    values = torch.tensor(payload.values(ValueKind.BF16))
    packed, _ = quantize(values, ValueKind.TWO_BIT)
    forged = TensorPayload(payload.xshape, payload.totalk, payload.k, payload.idx, packed)
    return DistroResult(result.step, result.batch_id, 0, ValueKind.TWO_BIT, (forged,))


def test_a_payload_rms_is_the_rms_of_its_values() -> None:
    for result in honest_results(BF16, 2):
        payload = result.tensors[0]
        assert payload.rms(ValueKind.BF16) == value_rms(payload.values(ValueKind.BF16))
