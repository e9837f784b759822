"""SparseLoCo: local AdamW round and pseudo-gradient, error feedback with what was sent,
the averaged outer step, cancellation, settings, and the Trainer's inner steps."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager

import pytest
import torch
from psyche_client.distro import DctTransform, OwnResult
from psyche_client.distro.sparseloco import SparseLocoOptimizer, SparseLocoSettings
from psyche_client.training.trainer import Trainer, TrainingCancelled
from psyche_common.batch_id import BatchId

from tests.support.tiny_distro import TinyNet, set_random_grads
from tests.unit.test_trainer import tiny_llama, tokens

SETTINGS = SparseLocoSettings(
    inner_steps=2,
    outer_lr=0.7,
    compression_decay=0.9,
    compression_topk=3,
    compression_chunk=4,
    quantize_2bit=True,
    weight_decay=0.0,
    clip_grad_norm=None,
)


def _round(optimizer: SparseLocoOptimizer, model: TinyNet, seeds: list[int], lr: float) -> None:
    for seed in seeds:
        set_random_grads(model, seed)
        optimizer.inner_step(lr)


def test_local_round_keeps_pseudo_gradient_and_restores_weights() -> None:
    model = TinyNet()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = SparseLocoOptimizer(model.named_parameters(), SETTINGS)
    with optimizer.local_round():
        _round(optimizer, model, [1, 2], 0.01)
        moved = {n: p.detach().clone() for n, p in model.named_parameters()}
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])
    set_random_grads(model, 9)  # gradients left over must not matter to generate
    generated = optimizer.generate(1, BatchId(0, 1), 0)
    transform = DctTransform(SETTINGS.compression_chunk)
    for i, (name, _) in enumerate(sorted(model.named_parameters())):
        pseudo = before[name] - moved[name]
        assert torch.equal(optimizer.error_buffer(name), pseudo)  # first round: e = delta
        idx, sent = generated.own.tensors[i]
        encoded = transform.encode(pseudo)
        kept = encoded.reshape(idx.shape[0], -1).gather(-1, idx)
        assert torch.equal(torch.sign(sent), torch.sign(kept)), name
        assert bool((sent.abs() <= kept.abs().amax(-1, keepdim=True) * 1.01).all())


@pytest.mark.parametrize(
    "values",
    [{}, {"quantize_codebook": True}, {"quantize_2bit": False, "quantize_4bit": True}],
    ids=["2bit", "2bit-codebook", "4bit"],
)
def test_error_feedback_subtracts_what_receivers_read(values: dict[str, bool]) -> None:
    model = TinyNet()
    settings = dataclasses.replace(SETTINGS, **values)
    optimizer = SparseLocoOptimizer(model.named_parameters(), settings)
    with optimizer.local_round():
        _round(optimizer, model, [1, 2], 0.01)
    first = optimizer.generate(1, BatchId(0, 1), 0)
    error_1 = {n: optimizer.error_buffer(n).clone() for n, _ in model.named_parameters()}
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    with optimizer.local_round([first.own]):
        lookahead = {n: p.detach().clone() for n, p in model.named_parameters()}
        _round(optimizer, model, [3, 4], 0.01)
        end = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer.generate(2, BatchId(0, 1), 1, [first.own])
    transform = DctTransform(SETTINGS.compression_chunk)
    kind = optimizer.layout.value_kind
    assert first.transmit.value_kind == kind
    for i, (name, p) in enumerate(sorted(model.named_parameters())):
        idx, sent = first.own.tensors[i]
        read = torch.from_numpy(first.transmit.tensors[i].values(kind).copy()).to(sent.dtype)
        assert torch.equal(sent, read), name  # error feedback keeps what receivers lose
        xshape = transform.xshape(p.shape)
        sparse = torch.zeros(idx.shape[0], xshape[-1] * (xshape[-2] if p.dim() > 1 else 1))
        sparse.scatter_(-1, idx, sent)
        decoded = transform.decode(sparse.view(xshape), p.shape)
        assert torch.allclose(lookahead[name], start[name] - 0.7 * decoded, atol=1e-6), name
        expected = 0.9 * (error_1[name] - decoded) + (lookahead[name] - end[name])
        assert torch.allclose(optimizer.error_buffer(name), expected, atol=1e-6), name


def _factors_from_rms(rms: list[float], clip: bool) -> list[float]:
    target = sorted(rms)[(len(rms) - 1) // 2]
    factors = [target / r if r > 0 else 0.0 for r in rms]
    return [min(1.0, f) for f in factors] if clip else factors


@pytest.mark.parametrize(
    ("choosers", "clip"),
    [(False, False), (True, False), (False, True)],
    ids=["over-all", "over-choosers", "clipped-to-median"],
)
def test_apply_is_outer_lr_times_mean_over_all_results_rounded_to_bf16(
    choosers: bool, clip: bool
) -> None:
    """The mean is over all results, or with `mean_over_choosers` over the results that chose
    each coefficient (Templar's SparseLoCo); each result is normalised per tensor to the
    median RMS, or with `clip_to_median` only scaled down to it."""
    settings = dataclasses.replace(SETTINGS, mean_over_choosers=choosers, clip_to_median=clip)
    results = []
    for r in range(3):
        model = TinyNet()
        optimizer = SparseLocoOptimizer(model.named_parameters(), SETTINGS)
        with optimizer.local_round():
            _round(optimizer, model, [10 * r, 10 * r + 1], 0.05)
        results.append(optimizer.generate(1, BatchId(2 * r, 2 * r + 1), 0).transmit)
    model = TinyNet()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = SparseLocoOptimizer(model.named_parameters(), settings)
    assert optimizer.apply(list(reversed(results)), lr=123.0) == 3
    transform = DctTransform(SETTINGS.compression_chunk)
    kind = optimizer.layout.value_kind
    for i, expected in enumerate(optimizer.layout.tensors):
        total = torch.zeros(expected.chunks, expected.totalk, dtype=torch.float64)
        chose = torch.zeros_like(total)
        # each result normalised to the lower median of the results' RMS (docs/distro.md)
        rms = [
            math.sqrt(
                math.fsum(v * v for v in r.tensors[i].values(kind).flatten().tolist())
                / expected.count
            )
            for r in results
        ]
        factors = _factors_from_rms(rms, clip)
        if clip:
            assert factors != _factors_from_rms(rms, False), "no result below the median"
        for result, factor in zip(results, factors, strict=True):
            payload = result.tensors[i]
            index = torch.tensor(payload.indices())
            total.scatter_add_(-1, index, torch.tensor(payload.values(kind)) * factor)
            chose.scatter_add_(-1, index, torch.ones(index.shape, dtype=torch.float64))
        if choosers:
            assert bool(((chose > 0) & (chose < 3)).any()), "no coefficient with fewer choosers"
            mean = torch.where(chose > 0, total / chose.clamp(min=1.0), 0.0)
        else:
            mean = total / 3
        update = transform.decode(mean.view(expected.xshape), expected.shape)
        step = update.to(torch.bfloat16).float() * 0.7
        got = dict(model.named_parameters())[expected.name]
        assert torch.equal(got, before[expected.name] - step), expected.name


@pytest.mark.parametrize("dct", [True, False], ids=["dct", "no-dct"])
def test_without_dct_a_result_moves_only_the_chosen_weights(dct: bool) -> None:
    """`dct = false`: top-k of each tile's raw values, so one result changes at most k weights
    per tile (with the DCT, its few coefficients spread over the whole tile)."""
    settings = dataclasses.replace(SETTINGS, dct=dct, quantize_2bit=False)
    model = TinyNet()
    optimizer = SparseLocoOptimizer(model.named_parameters(), settings)
    with optimizer.local_round():
        _round(optimizer, model, [1, 2], 0.05)
    result = optimizer.generate(1, BatchId(0, 1), 0).transmit
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer.apply([result], lr=1.0)
    for expected in optimizer.layout.tensors:
        after = dict(model.named_parameters())[expected.name]
        changed = int((after != before[expected.name]).sum())
        if dct:
            assert changed > expected.count, expected.name
        else:
            assert 0 < changed <= expected.count, expected.name


def test_generate_needs_a_round_and_settings_are_checked() -> None:
    model = TinyNet()
    optimizer = SparseLocoOptimizer(model.named_parameters(), SETTINGS)
    with pytest.raises(RuntimeError, match="local_round"):
        optimizer.generate(1, BatchId(0, 0), 0)
    for change, words in (
        ({"inner_steps": 0}, "inner_steps"),
        ({"outer_lr": 0.0}, "outer_lr"),
        ({"compression_topk": 0}, "compression_topk"),
        ({"compression_chunk": 0}, "compression_chunk"),
    ):
        with pytest.raises(ValueError, match=words):
            dataclasses.replace(SETTINGS, **change)


TRAINER_SETTINGS = dataclasses.replace(
    SETTINGS, inner_steps=3, compression_chunk=16, compression_topk=4, weight_decay=0.1
)


def test_trainer_takes_one_adamw_step_per_part_and_keeps_weights() -> None:
    trainer = Trainer(tiny_llama(), TRAINER_SETTINGS, device="cpu", micro_batch_size=2)
    before = trainer.weights_hash()
    out = trainer.train(BatchId(0, 5), tokens(0, n=6), 1, 1e-3, 0.0)
    assert out.result is not None and trainer.weights_hash() == before
    assert out.micro_batches == 3  # three parts of two samples, one micro-batch each
    inner = trainer.distro._inner  # the AdamW that took the inner steps
    assert {int(state["step"]) for state in inner.state.values()} == {3}
    assert trainer.decode_result(out.result.encode()) == out.result
    assert trainer.apply([out.result], 3, 1e-3) == 1
    assert trainer.weights_hash() != before


def test_cancelled_round_leaves_no_trace() -> None:
    trainer = Trainer(tiny_llama(), TRAINER_SETTINGS, device="cpu", micro_batch_size=2)
    trainer.train(BatchId(0, 5), tokens(0, n=6), 1, 1e-3, 0.0)
    before = trainer.weights_hash()
    optimizer = trainer.distro
    error = [e.clone() for e in optimizer._error]
    moments = {k: v["exp_avg"].clone() for k, v in optimizer._inner.state_dict()["state"].items()}
    calls: list[int] = []

    def cancel_in_second_part() -> bool:
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(TrainingCancelled):
        trainer.train(
            BatchId(6, 11), tokens(1, n=6), 2, 1e-3, 1e-3, cancelled=cancel_in_second_part
        )
    assert trainer.weights_hash() == before
    assert all(torch.equal(a, b) for a, b in zip(error, optimizer._error, strict=True))
    state = optimizer._inner.state_dict()["state"]
    assert all(torch.equal(moments[k], state[k]["exp_avg"]) for k in moments)
    assert {int(s["step"]) for s in state.values()} == {3}


def test_lookahead_uses_only_the_own_result_still_in_flight() -> None:
    """The own result of step S-1 is in flight during step S; one from an earlier step
    (the client skipped a round) has been applied already and must not be added again."""
    trainer = Trainer(tiny_llama(), TRAINER_SETTINGS, device="cpu", micro_batch_size=2)
    optimizer = trainer.distro
    seen: list[int] = []
    original = optimizer.local_round

    def spy(own_pending: Sequence[OwnResult] = ()) -> AbstractContextManager[None]:
        seen.append(len(own_pending))
        return original(own_pending)

    optimizer.local_round = spy
    for step in (1, 2, 4):
        trainer.train(BatchId(6 * step, 6 * step + 5), tokens(step, n=6), step, 1e-3, 1e-3)
    assert seen == [0, 1, 0]
