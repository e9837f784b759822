"""DistroOptimizer: momentum/error feedback, lookahead restore, apply semantics and
bit-identical replicas."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from psyche_client.distro import (
    DctTransform,
    DistroOptimizer,
    DistroResult,
    DistroSettings,
    canonical_order,
)
from psyche_client.distro.compress import topk_per_chunk
from psyche_common.batch_id import BatchId

from tests.support.exact_idct_reference import integer_sign_definition
from tests.support.tiny_distro import SETTINGS, TinyNet, set_random_grads

ONE_BIT = dataclasses.replace(SETTINGS, quantize_1bit=True)
TWO_BIT = dataclasses.replace(SETTINGS, quantize_2bit=True)
AGG_MOMENTUM = dataclasses.replace(SETTINGS, aggregate_momentum=0.9)


def test_first_generate_momentum_is_lr_times_grad() -> None:
    model = TinyNet()
    optimizer = DistroOptimizer(model.named_parameters(), SETTINGS)
    set_random_grads(model, 1)
    generated = optimizer.generate(0.5, 1, BatchId(0, 0), 0)
    transform = DctTransform(SETTINGS.compression_chunk)
    for i, (name, p) in enumerate(sorted(model.named_parameters())):
        expected = 0.5 * p.grad
        assert torch.equal(optimizer.momentum(name), expected)
        tile_dims = 2 if p.dim() >= 2 else 1
        idx, val = topk_per_chunk(transform.encode(expected), 3, tile_dims)
        own_idx, own_val = generated.own.tensors[i]
        assert torch.equal(own_idx, idx)
        assert torch.equal(own_val, val)


def test_error_feedback_subtracts_own_unquantized_result_before_decay() -> None:
    model = TinyNet()
    optimizer = DistroOptimizer(model.named_parameters(), ONE_BIT)
    set_random_grads(model, 1)
    grads1 = {n: p.grad.clone() for n, p in model.named_parameters()}
    first = optimizer.generate(0.1, 1, BatchId(0, 0), 0)
    set_random_grads(model, 2)
    optimizer.generate(0.1, 2, BatchId(1, 1), 1, own_previous=[first.own])
    transform = DctTransform(SETTINGS.compression_chunk)
    for i, (name, p) in enumerate(sorted(model.named_parameters())):
        tile_dims = 2 if p.dim() >= 2 else 1
        encoded = transform.encode(0.1 * grads1[name])
        idx, val = first.own.tensors[i]
        sparse = torch.zeros_like(encoded).reshape(idx.shape[0], -1).scatter(-1, idx, val)
        sent = transform.decode(sparse.view(encoded.shape), p.shape)
        expected = 0.9 * (0.1 * grads1[name] - sent) + 0.1 * p.grad
        assert torch.allclose(optimizer.momentum(name), expected, atol=1e-6), name
        assert tile_dims in (1, 2)


def test_lookahead_moves_along_the_published_result_and_restores_exact_weights() -> None:
    """The lookahead moves by `-prev_lr * sign(IDCT(r))`, `r` the trainer's own published
    result (the direction its apply will take: `aggregated_signs` of that one result), not
    along its private momentum, so a verifier can recompute the same point."""
    model = TinyNet()
    optimizer = DistroOptimizer(model.named_parameters(), SETTINGS)
    set_random_grads(model, 3)
    published = optimizer.generate(0.1, 1, BatchId(0, 0), 0).transmit
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    prev_lr = 0.0123
    names = sorted(before)
    differs_from_momentum_point = []
    with optimizer.lookahead(prev_lr, published):
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            signs = optimizer.compressor.aggregated_signs(
                i, [published.tensors[i]], device=torch.device("cpu")
            )
            assert name == names[i]
            assert torch.equal(p, before[name] - prev_lr * signs.view(p.shape))
            assert not torch.equal(p, before[name])
            momentum_point = before[name] - prev_lr * torch.sign(optimizer.momentum(name))
            differs_from_momentum_point.append(not torch.equal(p, momentum_point))
    assert any(differs_from_momentum_point)  # the reference's point (momentum signs) differs
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])
    with optimizer.lookahead(prev_lr, None), optimizer.lookahead(0.0, published):
        for name, p in model.named_parameters():
            assert torch.equal(p, before[name])  # nothing in flight, or no lr: no move


def test_lookahead_restores_weights_when_training_fails() -> None:
    model = TinyNet()
    optimizer = DistroOptimizer(model.named_parameters(), SETTINGS)
    set_random_grads(model, 3)
    published = optimizer.generate(0.1, 1, BatchId(0, 0), 0).transmit
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(RuntimeError), optimizer.lookahead(0.5, published):
        raise RuntimeError("cancelled")
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])


def _peer_results(settings: DistroSettings, peers: int, step: int = 1) -> list[DistroResult]:
    results = []
    for r in range(peers):
        model = TinyNet()
        optimizer = DistroOptimizer(model.named_parameters(), settings)
        set_random_grads(model, 100 + r)
        batch = BatchId(4 * r, 4 * r + 3)
        results.append(optimizer.generate(0.1, step, batch, 0).transmit)
    return results


@pytest.mark.parametrize("settings", [SETTINGS, ONE_BIT, TWO_BIT], ids=["bf16", "1bit", "2bit"])
def test_apply_is_scatter_mean_then_integer_inverse_dct_then_sign(
    settings: DistroSettings,
) -> None:
    """Against a loop written from the definition: bf16 and 2-bit results normalised per
    tensor to the lower median of their RMS values (docs/distro.md), then per coefficient
    the mean over the results that chose it (float64), the integer inverse DCT's sign,
    `theta -= lr * sign(.)`; and that sign is the float64 inverse DCT's wherever that is not
    within 1e-6 of 0."""
    results = _peer_results(settings, 3)
    model = TinyNet()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = DistroOptimizer(model.named_parameters(), settings)
    assert optimizer.apply(results, 0.25) == 3
    transform = DctTransform(settings.compression_chunk)
    for i, expected in enumerate(optimizer.layout.tensors):
        total = torch.zeros(expected.chunks, expected.totalk, dtype=torch.float64)
        count = torch.zeros_like(total)
        read = [
            _read_values(r.tensors[i].val, settings, expected.chunks, expected.k) for r in results
        ]
        factors = [1.0] * len(results) if settings.quantize_1bit else _normalising_factors(read)
        for result, values, factor in zip(results, read, factors, strict=True):
            payload = result.tensors[i]
            idx = torch.tensor(payload.indices())
            val = values * factor
            for c in range(expected.chunks):
                for j in range(expected.k):
                    total[c, idx[c, j]] += val[c, j]
                    count[c, idx[c, j]] += 1
        mean = torch.where(count > 0, total / count.clamp_min(1), 0.0).flatten()
        positions = mean.nonzero().flatten()
        signs = integer_sign_definition(expected, positions, mean[positions])
        want = before[expected.name] - 0.25 * torch.from_numpy(signs)
        got = dict(model.named_parameters())[expected.name]
        assert torch.equal(got, want), expected.name
        decoded = transform.decode(mean.view(expected.xshape), expected.shape)
        clear = decoded.abs() > 1e-6
        assert torch.equal(torch.sign(decoded).float()[clear], torch.from_numpy(signs)[clear])


def _normalising_factors(values: list[torch.Tensor]) -> list[float]:
    """Per result: (lower median of the RMS values) / (its RMS), from the definition."""
    rms = [math.sqrt(math.fsum(float(v) ** 2 for v in t.flatten()) / t.numel()) for t in values]
    target = sorted(rms)[(len(rms) - 1) // 2]
    return [target / r if r > 0 else 0.0 for r in rms]


def _read_values(data: bytes, settings: DistroSettings, chunks: int, k: int) -> torch.Tensor:
    """The transmitted values, decoded bit by bit from the format description."""
    if settings.quantize_1bit:
        bits = [(data[j // 8] >> (j % 8)) & 1 for j in range(chunks * k)]
        return torch.tensor([-1.0 if b else 1.0 for b in bits], dtype=torch.float64).view(chunks, k)
    if settings.quantize_2bit:
        scales = torch.frombuffer(bytearray(data[: 2 * chunks]), dtype=torch.bfloat16)
        codes = data[2 * chunks :]
        out = torch.zeros(chunks, k, dtype=torch.float64)
        for j in range(chunks * k):
            negative = (codes[2 * j // 8] >> (2 * j % 8)) & 1
            full = (codes[(2 * j + 1) // 8] >> ((2 * j + 1) % 8)) & 1
            magnitude = float(scales[j // k]) * (1.0 if full else 1.0 / 3.0)
            out[j // k, j % k] = -magnitude if negative else magnitude
        return out
    raw = torch.frombuffer(bytearray(data), dtype=torch.bfloat16)
    return raw.to(torch.float64).view(chunks, k)


def test_apply_nothing_leaves_weights_untouched() -> None:
    model = TinyNet()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert DistroOptimizer(model.named_parameters(), SETTINGS).apply([], 1.0) == 0
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])


def test_apply_weight_decay_is_multiplicative() -> None:
    settings = dataclasses.replace(SETTINGS, weight_decay=0.5)
    results = _peer_results(settings, 1)
    plain, decayed = TinyNet(), TinyNet()
    DistroOptimizer(plain.named_parameters(), SETTINGS).apply(results, 0.1)
    DistroOptimizer(decayed.named_parameters(), settings).apply(results, 0.1)
    reference = TinyNet()
    for (name, p), (_, q), (_, r) in zip(
        plain.named_parameters(),
        decayed.named_parameters(),
        reference.named_parameters(),
        strict=True,
    ):
        step = p - r  # -lr * sign(G)
        assert torch.allclose(q, r * (1 - 0.1 * 0.5) + step, atol=1e-6), name


def test_apply_rejects_mismatched_layout() -> None:
    results = _peer_results(SETTINGS, 1)
    other = dataclasses.replace(SETTINGS, compression_topk=2)
    model = TinyNet()
    with pytest.raises(ValueError, match="layout"):
        DistroOptimizer(model.named_parameters(), other).apply(results, 0.1)
    with pytest.raises(ValueError, match="value kind"):
        DistroOptimizer(model.named_parameters(), ONE_BIT).apply(results, 0.1)


@pytest.mark.parametrize(
    "settings",
    [SETTINGS, ONE_BIT, TWO_BIT, AGG_MOMENTUM],
    ids=["bf16", "1bit", "2bit", "aggregate-momentum"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_four_peers_stay_bit_identical(settings: DistroSettings, dtype: torch.dtype) -> None:
    """4 replicas, each generating from its own data and applying all 4 results (shuffled
    arrival order) through the delayed pipeline, keep bit-identical weights."""
    peers = 4
    models = [TinyNet(seed=0, dtype=dtype) for _ in range(peers)]
    optimizers = [DistroOptimizer(m.named_parameters(), settings) for m in models]
    own = [[] for _ in range(peers)]
    own_published: list[DistroResult | None] = [None] * peers
    pending: list[list[DistroResult]] = []
    shuffler = random.Random(5)
    for step in range(1, 7):
        if len(pending) >= 2:
            to_apply = pending.pop(0)
            for optimizer in optimizers:
                arrival = list(to_apply)
                shuffler.shuffle(arrival)
                optimizer.apply(arrival, 0.01)
        produced = []
        for r, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            with optimizer.lookahead(0.01, own_published[r]):
                data = torch.randn(4, 24, generator=torch.Generator().manual_seed(step * 10 + r))
                hidden = data.to(dtype) @ model.w_z.T
                loss = hidden.float().pow(2).mean() + model.w_a.float().sum() + model.b.sum()
                loss.backward()
            batch = BatchId(4 * r, 4 * r + 3)
            generated = optimizer.generate(0.01, step, batch, step - 1, own[r])
            own[r] = [generated.own]
            own_published[r] = generated.transmit
            for p in model.parameters():
                p.grad = None
            produced.append(generated.transmit)
        pending.append(produced)
        reference = [p.detach() for p in models[0].parameters()]
        for model in models[1:]:
            for p, q in zip(reference, model.parameters(), strict=True):
                assert torch.equal(p, q)
    assert not torch.equal(models[0].w_z.detach(), TinyNet(seed=0, dtype=dtype).w_z)


def _apply_steps(settings: DistroSettings, steps: int) -> tuple[TinyNet, DistroOptimizer]:
    """A fresh TinyNet applying `steps` result sets (3 peers each, other grads every step)."""
    model = TinyNet()
    optimizer = DistroOptimizer(model.named_parameters(), settings)
    for step in range(1, steps + 1):
        results = []
        for r in range(3):
            peer = TinyNet(seed=r)
            peer_optimizer = DistroOptimizer(peer.named_parameters(), settings)
            set_random_grads(peer, 1000 * step + r)
            batch = BatchId(4 * r, 4 * r + 3)
            results.append(peer_optimizer.generate(0.1, step, batch, 0).transmit)
        arrival = list(results)
        random.Random(step).shuffle(arrival)
        optimizer.apply(arrival, 0.05)
    return model, optimizer


def test_aggregate_momentum_keeps_replicas_bit_identical_and_changes_the_weights() -> None:
    """Two replicas applying the same results with aggregate_momentum 0.9 end bit-identical
    (weights and buffer); their weights differ from those of plain sign steps."""
    first, first_opt = _apply_steps(AGG_MOMENTUM, 4)
    second, second_opt = _apply_steps(AGG_MOMENTUM, 4)
    plain, _ = _apply_steps(SETTINGS, 4)
    for (name, p), (_, q), (_, r) in zip(
        first.named_parameters(), second.named_parameters(), plain.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), name
        assert torch.equal(
            first_opt.aggregate_momentum_buffer(name), second_opt.aggregate_momentum_buffer(name)
        )
        assert first_opt.aggregate_momentum_buffer(name).dtype == torch.float32
        assert not torch.equal(p, r), name


def test_aggregate_momentum_is_an_ema_of_the_applied_signs() -> None:
    """One apply: m = (1 - beta) * sign(G) and theta -= lr * m; the sign is the one the plain
    optimizer applies from the same results."""
    settings = dataclasses.replace(SETTINGS, aggregate_momentum=0.75, weight_decay=0.5)
    results = _peer_results(settings, 3)
    plain, momentum = TinyNet(), TinyNet()
    before = {n: p.detach().clone() for n, p in plain.named_parameters()}
    DistroOptimizer(plain.named_parameters(), SETTINGS).apply(results, 0.25)
    optimizer = DistroOptimizer(momentum.named_parameters(), settings)
    optimizer.apply(results, 0.25)
    for (name, p), (_, q) in zip(
        plain.named_parameters(), momentum.named_parameters(), strict=True
    ):
        signs = (before[name] - p) / 0.25
        assert set(signs.round().unique().tolist()) <= {-1.0, 0.0, 1.0}
        expected_m = 0.25 * signs.round()
        assert torch.equal(optimizer.aggregate_momentum_buffer(name), expected_m), name
        expected = before[name] * (1 - 0.25 * 0.5) - 0.25 * expected_m
        assert torch.allclose(q, expected, atol=1e-6), name


def test_without_aggregate_momentum_apply_is_the_plain_sign_step() -> None:
    """aggregate_momentum 0.0 (the default): every apply is theta -= lr * sign(G), G from the
    results as the compressor aggregates them, over several steps; there is no buffer."""
    model = TinyNet()
    optimizer = DistroOptimizer(model.named_parameters(), SETTINGS)
    for step in range(1, 4):
        results = _peer_results(SETTINGS, 3, step)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer.apply(results, 0.05)
        ordered = canonical_order(results)
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            signs = optimizer.compressor.aggregated_signs(
                i, [r.tensors[i] for r in ordered], device=p.device
            )
            assert signs.abs().sum() > 0
            assert torch.equal(p, before[name] - 0.05 * signs), name
    with pytest.raises(ValueError, match="aggregate_momentum"):
        optimizer.aggregate_momentum_buffer("b")


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_aggregate_momentum_out_of_range_is_refused_naming_the_field(value: float) -> None:
    with pytest.raises(ValueError, match="aggregate_momentum"):
        dataclasses.replace(SETTINGS, aggregate_momentum=value)


def test_zero_momentum_clears_the_aggregate_momentum() -> None:
    _, optimizer = _apply_steps(AGG_MOMENTUM, 2)
    names = [tensor.name for tensor in optimizer.layout.tensors]
    assert all(optimizer.aggregate_momentum_buffer(n).abs().sum() > 0 for n in names)
    optimizer.zero_momentum()
    for name in names:
        assert torch.equal(
            optimizer.aggregate_momentum_buffer(name),
            torch.zeros_like(optimizer.aggregate_momentum_buffer(name)),
        )
        assert optimizer.momentum(name).abs().sum() == 0
