"""The real training backend: two replicas exchange results and stay bit-identical."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from psyche_client.distro.values import ValueKind
from psyche_client.training.backend import shared_config_json
from psyche_client.training.distro_backend import DistroBackend
from psyche_client.verify.threshold import ACCUSE_BELOW
from psyche_client.weights.backends import BACKENDS, BackendOptions, with_distro_backend
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Coordinator, RunState

from tests.e2e.signflip_client import SignFlipBackend
from tests.support.coordinators import coordinator_in, distro_model, ids


def make_coordinator() -> Coordinator:
    """The Warmup (where the backend loads) of a DisTrO run of the built-in tiny Llama."""
    return coordinator_in(RunState.Warmup, ids(2), model=distro_model(chunk=16, topk=4))


PRECISIONS = {
    "fp32": BackendOptions(device="cpu", micro_batch_size=2),
    "bf16": BackendOptions(
        device="cpu",
        micro_batch_size=1,
        dtype="bf16",
        grad_accum_in_fp32=True,
        activation_checkpointing=True,
        attn_implementation="eager",
    ),
}


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_replicas_stay_identical_and_reject_tampering(precision: str) -> None:
    """Two replicas loaded through the backend registry with the flags' options."""
    torch.set_num_threads(1)
    coordinator = make_coordinator()
    options = PRECISIONS[precision]
    a, b = (BACKENDS["distro"].load(coordinator, options, None, False) for _ in range(2))
    assert isinstance(a, DistroBackend) and isinstance(b, DistroBackend)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    assert {p.dtype for p in a.trainer.model.parameters()} == {dtype}
    assert a.trainer.grad_accum_in_fp32 == options.grad_accum_in_fp32
    assert a.weights_hash() == b.weights_hash()
    rng = np.random.default_rng(0)
    batch_a, batch_b = BatchId(0, 1), BatchId(2, 3)
    out_a = a.train(1, batch_a, rng.integers(0, 200, (2, 16)), lambda: False)
    out_b = b.train(1, batch_b, rng.integers(0, 200, (2, 16)), lambda: False)
    assert out_a is not None and out_b is not None
    assert np.isfinite(out_a.loss)
    results = []
    for out, batch in ((out_a, batch_a), (out_b, batch_b)):
        decoded_a = a.decode(1, batch, out.payload, out.data_hash)
        decoded_b = b.decode(1, batch, out.payload, out.data_hash)
        results.append((decoded_a, decoded_b))
    before = a.weights_hash()
    a.apply(3, [r[0] for r in results])
    b.apply(3, [r[1] for r in reversed(results)])
    assert a.weights_hash() == b.weights_hash() != before
    tampered = bytearray(out_a.payload)
    tampered[-1] ^= 0x01
    with pytest.raises(ValueError):
        a.decode(1, batch_a, bytes(tampered), out_a.data_hash)
    with pytest.raises(ValueError):
        a.decode(2, batch_a, out_a.payload, out_a.data_hash)
    assert a.train(2, batch_a, rng.integers(0, 200, (2, 16)), lambda: True) is None


def test_parameters_round_trip_through_export() -> None:
    coordinator = make_coordinator()
    a = DistroBackend.load(coordinator, device="cpu", micro_batch_size=2)
    a.train(1, BatchId(0, 1), np.ones((2, 16), dtype=np.int64), lambda: False)
    entries = a.export_parameters()
    b = DistroBackend.load(
        coordinator,
        device="cpu",
        micro_batch_size=2,
        peer_config=json.loads(shared_config_json(a.capabilities)),
    )
    assert b.info.kind == "p2p"
    with torch.no_grad():
        for p in b.trainer.model.parameters():
            p.add_(1.0)
    assert a.weights_hash() != b.weights_hash()
    b.load_parameters({name: data for name, _, _, data in entries})
    assert a.weights_hash() == b.weights_hash()
    with pytest.raises(ValueError):
        b.load_parameters({"nope": b""})


def test_weights_from_peers_restart_the_momentum_and_snapshots_restore_exactly() -> None:
    torch.set_num_threads(1)
    coordinator = make_coordinator()
    a = DistroBackend.load(coordinator, device="cpu", micro_batch_size=2)
    a.train(1, BatchId(0, 1), np.ones((2, 16), dtype=np.int64), lambda: False)
    distro = a.trainer.distro
    names = [name for name, _ in a.trainer.model.named_parameters()]
    assert any(distro.momentum(name).abs().sum() > 0 for name in names)
    a.load_parameters({name: data for name, _, _, data in a.export_parameters()})
    assert all(distro.momentum(name).abs().sum() == 0 for name in names)
    # snapshot / restore: an early apply undone leaves the weights bit-identical
    before = a.weights_hash()
    snapshot = a.snapshot()
    with torch.no_grad():
        for p in a.trainer.model.parameters():
            p.add_(0.5)
    assert a.trainer.weights_digest() != before
    a.restore(snapshot)
    assert a.weights_hash() == before == a.trainer.weights_digest()


def test_a_distro_backend_subclass_from_the_registry_trains_instead() -> None:
    """`with_distro_backend` (how tests/e2e/signflip_client.py is built): the registry's
    distro entry loads the subclass, here the sign flipper, whose results are the honest ones
    negated, the same positions chosen (its gradients are negated as they are computed)."""
    torch.set_num_threads(1)
    coordinator = coordinator_in(
        RunState.Warmup, ids(2), model=distro_model(chunk=16, topk=4, quantize_1bit=False)
    )
    options = BackendOptions(device="cpu", micro_batch_size=2)
    honest = BACKENDS["distro"].load(coordinator, options, None, False)
    flipper = with_distro_backend(SignFlipBackend)["distro"].load(coordinator, options, None, False)
    assert type(honest) is DistroBackend and isinstance(flipper, SignFlipBackend)
    batch, tokens = BatchId(0, 1), np.arange(32, dtype=np.int64).reshape(2, 16)
    out_honest = honest.train(1, batch, tokens, lambda: False)
    out_flipped = flipper.train(1, batch, tokens, lambda: False)
    assert out_honest is not None and out_flipped is not None
    mine = honest.decode(1, batch, out_honest.payload, out_honest.data_hash)
    negated = flipper.decode(1, batch, out_flipped.payload, out_flipped.data_hash)
    for a, b in zip(mine.tensors, negated.tensors, strict=True):
        assert a.idx == b.idx
        np.testing.assert_array_equal(b.values(ValueKind.BF16), -a.values(ValueKind.BF16))
    # a verifier's recomputed reference stays honest
    reference_honest = honest.recompute(tokens)
    reference_flipper = flipper.recompute(tokens)
    assert reference_honest is not None and reference_flipper is not None
    for a, b in zip(reference_honest, reference_flipper, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_verifier_at_the_lookahead_point_accuses_a_gradient_negator_every_step() -> None:
    """Issue 29: a trainer that negates its gradients looks ahead along its own (negated)
    published result, against the descent; recomputed at the round's weights, its negated
    gradient there came to agree with the fresh one within a few steps and passed the check.
    The verifier now recomputes at the trainer's lookahead point (`along`: the trainer's
    published result of the step before), the point it trained at, so the negator's
    results fail every check while an honest trainer's pass (`builtin:llama-tiny`, 1-bit,
    8 steps with the two-step apply delay)."""
    torch.set_num_threads(1)
    coordinator = coordinator_in(
        RunState.Warmup, ids(3), model=distro_model(chunk=16, topk=4, quantize_1bit=True)
    )
    options = BackendOptions(device="cpu", micro_batch_size=2)
    honest = BACKENDS["distro"].load(coordinator, options, None, False)
    negator = with_distro_backend(SignFlipBackend)["distro"].load(coordinator, options, None, False)
    verifier = BACKENDS["distro"].load(coordinator, options, None, False)
    assert isinstance(verifier, DistroBackend)
    rng = np.random.default_rng(4)
    published: dict[int, list] = {}
    last: dict[str, object] = {}
    scores: dict[str, list[float]] = {"honest": [], "negator": []}
    for step in range(1, 9):
        if step - 2 in published:
            applied = published.pop(step - 2)
            for backend in (honest, negator, verifier):
                backend.apply(step, applied)
        produced = []
        for name, backend, batch in (
            ("honest", honest, BatchId(0, 1)),
            ("negator", negator, BatchId(2, 3)),
        ):
            tokens = rng.integers(0, 256, (2, 16))
            out = backend.train(step, batch, tokens, lambda: False)
            assert out is not None
            result = verifier.decode(step, batch, out.payload, out.data_hash)
            reference = verifier.recompute(tokens, step, last.get(name))  # type: ignore[arg-type]
            assert reference is not None
            if name in last:  # it trained the step before: not the round's weights' gradient
                plain = verifier.recompute(tokens, step, None)
                assert plain is not None
                assert any(not np.array_equal(a, b) for a, b in zip(reference, plain, strict=True))
            scores[name].append(verifier.agreement(reference, result))
            last[name] = result
            produced.append(result)
        published[step] = produced
    assert min(scores["honest"]) >= ACCUSE_BELOW, scores
    assert max(scores["negator"]) < ACCUSE_BELOW, scores
    assert honest.weights_hash() == negator.weights_hash() == verifier.weights_hash()
