"""`--optim-stats-steps`: the per-tensor DisTrO statistics (`distro.stats`), what `generate`
measures with them, and the trainer's recorder (which steps, bounded, taken once)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from psyche_client.distro import DistroOptimizer
from psyche_client.distro.stats import (
    captured_energy,
    index_overlap,
    l1_energy,
    mean_captured_energy,
)
from psyche_client.training.optim_stats import (
    KEEP_STEPS,
    OptimStatsRecorder,
    results_index_overlap,
)
from psyche_common.batch_id import BatchId

from tests.support.tiny_distro import SETTINGS, TinyNet, generate_result, set_random_grads


def test_l1_energy_sums_magnitudes() -> None:
    assert l1_energy(torch.tensor([1.0, -2.0, 0.5])) == 3.5


def test_captured_energy_per_tile() -> None:
    coefficients = torch.tensor([[3.0, 4.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    kept = torch.tensor([[4.0], [1.0], [0.0]])
    share = captured_energy(coefficients, kept)
    assert share.tolist() == pytest.approx([16 / 25, 1 / 3, 1.0])  # an empty tile lost nothing
    assert mean_captured_energy(coefficients, kept) == pytest.approx((16 / 25 + 1 / 3 + 1) / 3)


def test_captured_energy_refuses_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="chunks"):
        captured_energy(torch.zeros(2, 4), torch.zeros(3, 1))


def test_index_overlap_identical_disjoint_and_partial() -> None:
    a = np.array([[0, 1], [2, 3]])
    assert index_overlap([a, a.copy()], totalk=4) == 1.0
    assert index_overlap([a, np.array([[2, 3], [0, 1]])], totalk=4) == 0.0
    # one shared index of two in the first tile, both in the second: (1/2 + 2/2) / 2
    assert index_overlap([a, np.array([[1, 2], [3, 2]])], totalk=4) == pytest.approx(0.75)
    # three results: pairs (a,b)=1, (a,c)=0, (b,c)=0 over both tiles
    assert index_overlap([a, a, np.array([[2, 3], [0, 1]])], totalk=4) == pytest.approx(1 / 3)
    assert index_overlap([a], totalk=4) is None


def test_index_overlap_refuses_indices_outside_the_tile() -> None:
    with pytest.raises(ValueError, match="outside"):
        index_overlap([np.array([[0, 4]]), np.array([[0, 1]])], totalk=4)


def test_generate_measures_each_parameter_only_when_asked() -> None:
    model = TinyNet()
    optimizer = DistroOptimizer(model.named_parameters(), SETTINGS)
    set_random_grads(model, 1)
    plain = optimizer.generate(0.5, 1, BatchId(0, 0), 0)
    assert plain.stats == {}
    set_random_grads(model, 2)
    measured = optimizer.generate(0.5, 2, BatchId(0, 0), 1, [plain.own], stats=True)
    names = sorted(name for name, _ in model.named_parameters())
    assert set(measured.stats) == {
        f"{name}.{kind}"
        for name in names
        for kind in ("grad_energy", "delta_energy", "captured_energy")
    }
    params = dict(model.named_parameters())
    for i, name in enumerate(names):
        grad = params[name].grad
        assert grad is not None
        assert measured.stats[f"{name}.grad_energy"] == pytest.approx(float(grad.abs().sum()))
        delta = optimizer.momentum(name)
        assert measured.stats[f"{name}.delta_energy"] == pytest.approx(float(delta.abs().sum()))
        # the DCT is orthonormal: the tiles' coefficient energy is the momentum's energy
        coefficients = optimizer.compressor.coefficients(i, delta)
        assert float(coefficients.pow(2).sum()) == pytest.approx(float(delta.pow(2).sum()))
        captured = measured.stats[f"{name}.captured_energy"]
        totalk = optimizer.layout.tensors[i].totalk
        assert 0.0 < captured <= 1.0
        assert captured >= min(1.0, SETTINGS.compression_topk / totalk) - 1e-9
    # measuring changes nothing that is sent
    model2 = TinyNet()
    twin = DistroOptimizer(model2.named_parameters(), SETTINGS)
    set_random_grads(model2, 1)
    first = twin.generate(0.5, 1, BatchId(0, 0), 0)
    set_random_grads(model2, 2)
    second = twin.generate(0.5, 2, BatchId(0, 0), 1, [first.own])
    assert second.transmit.encode() == measured.transmit.encode()


def test_results_index_overlap_of_applied_results() -> None:
    optimizer, one = generate_result(seed=1)
    _, same = generate_result(seed=1, start=12)
    _, other = generate_result(seed=2, start=16)
    layout = optimizer.layout
    identical = results_index_overlap(layout, [one.transmit, same.transmit])
    assert set(identical) == {f"{t.name}.index_overlap" for t in layout.tensors}
    assert all(value == 1.0 for value in identical.values())
    mixed = results_index_overlap(layout, [one.transmit, other.transmit])
    assert all(0.0 <= value < 1.0 for value in mixed.values())
    assert results_index_overlap(layout, [one.transmit]) == {}


def test_recorder_measures_every_nth_step_and_is_taken_once() -> None:
    never = OptimStatsRecorder(0)
    assert not any(never.due(step) for step in range(10))
    every3 = OptimStatsRecorder(3)
    assert [step for step in range(1, 10) if every3.due(step)] == [3, 6, 9]
    every3.record(3, {"w.grad_energy": 1.0})
    every3.record(3, {"w.index_overlap": 0.5})
    every3.record(6, {})
    assert every3.take() == [(3, {"w.grad_energy": 1.0, "w.index_overlap": 0.5})]
    assert every3.take() == []
    for step in range(KEEP_STEPS + 5):
        every3.record(step, {"x": math.pi})
    taken = every3.take()
    assert len(taken) == KEEP_STEPS and taken[0][0] == 5
    with pytest.raises(ValueError):
        OptimStatsRecorder(-1)


def test_nothing_is_measured_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `--optim-stats-steps 0` (stats=False) `generate` computes no statistic at all:
    the round pays nothing for them."""
    import psyche_client.distro.optimizer as optimizer_module

    def forbidden(*_: object) -> float:
        raise AssertionError("a statistic was computed")

    monkeypatch.setattr(optimizer_module, "l1_energy", forbidden)
    monkeypatch.setattr(optimizer_module, "mean_captured_energy", forbidden)
    model = TinyNet()
    optimizer = DistroOptimizer(model.named_parameters(), SETTINGS)
    set_random_grads(model, 1)
    assert optimizer.generate(0.5, 1, BatchId(0, 0), 0).stats == {}
    with pytest.raises(AssertionError, match="statistic"):
        optimizer.generate(0.5, 2, BatchId(0, 0), 1, stats=True)
