"""Trainer: micro-batching, lookahead restore, error feedback, cancellation, AdamW, apply
through the client-facing API, and bit-identical replicas."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
import transformers
from psyche_client.distro import DistroResult, DistroSettings, ResultDecodeError, ValueKind
from psyche_client.distro.sparseloco import SparseLocoSettings
from psyche_client.training.model import loading as model_io
from psyche_client.training.trainer import (
    AdamWSettings,
    Fp32GradAccumulator,
    Trainer,
    TrainingCancelled,
    optimizer_settings,
    weights_digest,
)
from psyche_common.batch_id import BatchId
from psyche_common.config.optimizer import AdamWOptimizer
from psyche_common.config.optimizer import DistroOptimizer as DistroConfig
from psyche_common.config.optimizer import SparseLocoOptimizer as SparseLocoConfig

DISTRO = DistroSettings(
    compression_decay=0.999, compression_topk=4, compression_chunk=16, quantize_1bit=True
)
SEQ = 12


def tiny_llama(seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config)


def tokens(seed: int, n: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, SEQ), dtype=np.int64)


def make_trainer(settings=DISTRO, micro_batch_size: int = 2, **kwargs) -> Trainer:
    return Trainer(
        tiny_llama(), settings, device="cpu", micro_batch_size=micro_batch_size, **kwargs
    )


def test_settings_from_config_models() -> None:
    distro = DistroConfig(
        compression_decay=0.99,
        compression_topk=8,
        compression_chunk=64,
        quantize_1bit=False,
        clip_grad_norm=1.0,
    )
    assert optimizer_settings(distro) == DistroSettings(0.99, 8, 64, False, 0.0, 1.0)
    two_bit = distro.model_copy(update={"quantize_2bit": True})
    assert optimizer_settings(two_bit).value_kind == ValueKind.TWO_BIT
    adamw = AdamWOptimizer(betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    assert optimizer_settings(adamw) == AdamWSettings((0.9, 0.95), 0.1, 1e-8, None)
    sparseloco = SparseLocoConfig(
        inner_steps=5,
        outer_lr=1.0,
        compression_decay=0.95,
        compression_topk=32,
        compression_chunk=64,
        quantize_2bit=True,
        betas=(0.9, 0.95),
        weight_decay=0.1,
        eps=1e-8,
    )
    assert optimizer_settings(sparseloco) == SparseLocoSettings(
        5, 1.0, 0.95, 32, 64, True, (0.9, 0.95), 1e-8, 0.1, None
    )
    with pytest.raises(ValueError, match="unsupported optimizer"):
        optimizer_settings(object())


def test_train_returns_decodable_result_and_keeps_weights() -> None:
    trainer = make_trainer()
    before = trainer.weights_hash()
    out = trainer.train(BatchId(0, 3), tokens(0), step=1, lr=0.01, prev_lr=0.0)
    assert 4.0 < out.loss < 7.0  # about ln(256) = 5.5 at init
    assert out.micro_batches == 2
    assert out.result is not None
    assert out.result.step == 1 and out.result.batch_id == BatchId(0, 3)
    assert out.result.trainer_nonce == 0
    decoded = trainer.decode_result(out.result.encode())
    assert decoded.data_hash() == out.result.data_hash()
    # a DisTrO step only moves the momentum; weights change in apply
    assert trainer.weights_hash() == before
    second = trainer.train(BatchId(4, 7), tokens(1), step=2, lr=0.01, prev_lr=0.01)
    assert second.result is not None and second.result.trainer_nonce == 1
    assert trainer.weights_hash() == before  # lookahead undone by exact restore


def test_micro_batches_weight_tokens_equally() -> None:
    """Uneven micro-batches (2+2+1) give the same loss and grads as one batch of 5."""
    data = tokens(3, n=5)
    one = make_trainer(micro_batch_size=5)
    split = make_trainer(micro_batch_size=2)
    out_one = one.train(BatchId(0, 4), data, 1, 0.1, 0.0)
    out_split = split.train(BatchId(0, 4), data, 1, 0.1, 0.0)
    assert out_split.micro_batches == 3
    assert out_split.loss == pytest.approx(out_one.loss, rel=1e-5)
    for name, _ in one.model.named_parameters():
        assert torch.allclose(one.distro.momentum(name), split.distro.momentum(name), atol=1e-7)


def test_error_feedback_uses_own_previous_result() -> None:
    with_feedback = make_trainer()
    without = make_trainer()
    for trainer in (with_feedback, without):
        trainer.train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    without.drop_pending_result()
    for trainer in (with_feedback, without):
        trainer.train(BatchId(4, 7), tokens(1), 2, 0.01, 0.01)
    name = "lm_head.weight"
    difference = without.distro.momentum(name) - with_feedback.distro.momentum(name)
    assert difference.abs().max() > 0


def test_clipping_bounds_the_gradient() -> None:
    settings = dataclasses.replace(DISTRO, clip_grad_norm=1e-3, compression_decay=1.0)
    trainer = make_trainer(settings)
    out = trainer.train(BatchId(0, 3), tokens(0), 1, 1.0, 0.0)
    assert out.grad_norm is not None and out.grad_norm > 1e-3
    norm = torch.sqrt(sum(trainer.distro.momentum(n).pow(2).sum() for n, _ in trainer._params))
    assert float(norm) == pytest.approx(1e-3, rel=1e-3)


def test_cancelled_training_leaves_no_trace() -> None:
    trainer = make_trainer()
    trainer.train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    before = trainer.weights_hash()
    momentum = {n: trainer.distro.momentum(n).clone() for n, _ in trainer._params}
    calls = []

    def cancel_after_first() -> bool:
        calls.append(1)
        return len(calls) > 1

    with pytest.raises(TrainingCancelled):
        trainer.train(BatchId(4, 7), tokens(1), 2, 0.01, 0.5, cancelled=cancel_after_first)
    assert trainer.weights_hash() == before
    for name, value in momentum.items():
        assert torch.equal(trainer.distro.momentum(name), value)
    assert all(p.grad is None for p in trainer.model.parameters())


def test_zero_optim_resets_momentum() -> None:
    trainer = make_trainer()
    trainer.train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    out = trainer.train(BatchId(4, 7), tokens(1), 2, 0.0, 0.0, zero_optim=True)
    assert out.result is not None
    assert all(float(trainer.distro.momentum(n).abs().max()) == 0.0 for n, _ in trainer._params)


def test_adamw_steps_directly() -> None:
    trainer = make_trainer(AdamWSettings())
    before = trainer.weights_hash()
    out = trainer.train(BatchId(0, 3), tokens(0), 1, 1e-3, 0.0)
    assert out.result is None
    assert out.grad_norm is not None
    assert trainer.weights_hash() != before
    with pytest.raises(RuntimeError, match=r"adamw.*shares no results"):
        trainer.apply([], 1, 1e-3)


def test_rejects_bad_tokens() -> None:
    trainer = make_trainer()
    with pytest.raises(ValueError, match="shape"):
        trainer.train(BatchId(0, 0), np.zeros(12, dtype=np.int64), 1, 0.01, 0.0)
    with pytest.raises(ValueError, match="integers"):
        trainer.train(BatchId(0, 0), np.zeros((1, 12), dtype=np.float32), 1, 0.01, 0.0)


def test_decode_result_rejects_other_model() -> None:
    out = make_trainer().train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    other = Trainer(
        tiny_llama(),
        dataclasses.replace(DISTRO, compression_chunk=8),
        device="cpu",
        micro_batch_size=2,
    )
    assert out.result is not None
    with pytest.raises(ResultDecodeError):
        other.decode_result(out.result.encode())


SPARSELOCO = SparseLocoSettings(
    inner_steps=2,
    outer_lr=1.0,
    compression_decay=0.95,
    compression_topk=4,
    compression_chunk=16,
    quantize_2bit=True,
)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize(
    "settings",
    [DISTRO, dataclasses.replace(DISTRO, quantize_1bit=False, quantize_2bit=True), SPARSELOCO],
    ids=["distro-1bit", "distro-2bit", "sparseloco"],
)
def test_four_clients_pipeline_bit_identical(settings: object, dtype: str) -> None:
    """4 clients over 5 rounds with the two-round delay: every client applies the same
    results (arrival order differs) and all weight hashes agree and move."""
    base = tiny_llama()
    clients = [
        Trainer(copy.deepcopy(base), settings, device="cpu", micro_batch_size=2, dtype=dtype)
        for _ in range(4)
    ]
    initial = clients[0].weights_hash()
    history: dict[int, list[DistroResult]] = {}
    lr = {s: 0.002 * s for s in range(0, 8)}
    for step in range(1, 6):
        if step - 2 in history:
            for i, client in enumerate(clients):
                received = [client.decode_result(r.encode()) for r in history[step - 2]]
                rotated = received[i:] + received[:i]
                assert client.apply(rotated, step, lr[step]) == 4
        produced = []
        for i, client in enumerate(clients):
            batch = BatchId(8 * step + 2 * i, 8 * step + 2 * i + 1)
            out = client.train(batch, tokens(100 * step + i, n=2), step, lr[step], lr[step - 1])
            assert out.result is not None
            produced.append(out.result)
        history[step] = produced
        hashes = {client.weights_hash() for client in clients}
        assert len(hashes) == 1
    assert clients[0].weights_hash() != initial
    assert clients[0].weights_digest() == weights_digest(clients[3].model)
    assert clients[0].weights_hash() == model_io.weights_hash(clients[1].model)


def test_bf16_dtype_casts_model() -> None:
    trainer = make_trainer(dtype="bf16")
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    out = trainer.train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    assert np.isfinite(out.loss)
    with pytest.raises(ValueError, match="unknown dtype"):
        make_trainer(dtype="fp8")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_matches_device() -> None:
    trainer = Trainer(tiny_llama(), DISTRO, device="cuda", micro_batch_size=2)
    out = trainer.train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    assert out.result is not None
    assert trainer.apply([out.result], 3, 0.01) == 1
    assert all(p.device.type == "cuda" for p in trainer.model.parameters())


def test_the_timed_forward_backward_waits_for_a_cuda_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CUDA queues the backward's kernels: the step waits for them before its clock reading
    (a step's forward/backward seconds, what bench/client.py and bench/distro.py report);
    the CPU has nothing to wait for."""
    from psyche_client.training import trainer as trainer_module

    waited: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    trainer_module._wait_for_device(torch.device("cpu"))
    assert waited == []
    trainer_module._wait_for_device(torch.device("cuda", 1))
    assert waited == [torch.device("cuda", 1)]
    make_trainer().train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    assert waited == [torch.device("cuda", 1)]


def test_momentum_stays_fp32_in_a_bf16_model() -> None:
    trainer = make_trainer(dtype="bf16")
    trainer.train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    distro = trainer.distro
    name = "model.layers.0.mlp.up_proj.weight"
    assert trainer.model.get_parameter(name).dtype == torch.bfloat16
    assert distro.momentum(name).dtype == torch.float32  # type: ignore[union-attr]
    assert distro.momentum(name).abs().sum() > 0  # type: ignore[union-attr]


def test_fp32_accumulator_keeps_what_bf16_sums_round_away() -> None:
    param = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))
    accumulator = Fp32GradAccumulator.for_params([param])
    assert accumulator is not None
    for value in (1.0, 2.0**-9, 2.0**-9, 2.0**-9, 2.0**-9):
        param.grad = torch.tensor([value], dtype=torch.bfloat16)
        accumulator.collect()
        assert param.grad is None
    accumulator.release()
    assert param.grad is not None and param.grad.dtype == torch.bfloat16
    assert float(param.grad) == 1.0 + 2.0**-7  # a bf16 running sum stays at 1.0
    fp32 = torch.nn.Parameter(torch.zeros(1))
    assert Fp32GradAccumulator.for_params([fp32]) is None


def _micro_batch_grads(trainer: Trainer, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of `trainer`'s micro-batches, each computed alone, summed in fp32."""
    sums: dict[str, torch.Tensor] = {}
    total = input_ids.shape[0]
    for micro in torch.split(input_ids, trainer.micro_batch_size):
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer.model(input_ids=micro, labels=micro).loss
        (loss * (micro.shape[0] / total)).backward()
        for name, p in trainer.model.named_parameters():
            assert p.grad is not None
            sums[name] = sums.get(name, torch.zeros_like(p, dtype=torch.float32)) + p.grad.float()
    trainer.model.zero_grad(set_to_none=True)
    return sums


@pytest.mark.parametrize("in_fp32", [True, False])
def test_grad_accum_in_fp32_rounds_the_fp32_sum_once(in_fp32: bool) -> None:
    trainer = make_trainer(micro_batch_size=1, dtype="bf16", grad_accum_in_fp32=in_fp32)
    input_ids = torch.from_numpy(tokens(3))
    expected = _micro_batch_grads(trainer, input_ids)
    trainer._forward_backward(input_ids, None)
    rounded_once = all(
        torch.equal(p.grad, expected[name].to(torch.bfloat16))  # type: ignore[arg-type]
        for name, p in trainer.model.named_parameters()
    )
    # with bf16 running sums (the flag off) some element rounds differently
    assert rounded_once == in_fp32


def test_activation_checkpointing_and_attention_kernel_keep_the_result() -> None:
    from psyche_client.training.model.numerics import configure_model
    from psyche_client.training.model.precision import Precision

    plain = make_trainer()
    model = configure_model(
        tiny_llama(),
        Precision(activation_checkpointing=True, attn_implementation="eager"),
        torch.device("cpu"),
    )
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    assert model.config._attn_implementation == "eager"  # type: ignore[attr-defined]
    checkpointed = Trainer(model, DISTRO, device="cpu", micro_batch_size=2)
    a = plain.train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    b = checkpointed.train(BatchId(0, 3), tokens(0), 1, 0.01, 0.0)
    assert a.loss == pytest.approx(b.loss, rel=1e-5)
    assert a.result is not None and b.result is not None
    assert a.result.data_hash() == b.result.data_hash()
    # the sdpa default on a family without that kernel keeps the family's own (Gemma2)
    from tests.support.model_families import family

    gemma = model_io.build_model_from_config(family("gemma2").build().to_dict())
    configure_model(gemma, Precision(), torch.device("cpu"))
    assert gemma.config._attn_implementation == "eager"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="flash_attention_2 needs a CUDA device"):
        configure_model(
            tiny_llama(), Precision(attn_implementation="flash_attention_2"), torch.device("cpu")
        )


def test_optim_stats_every_n_steps_from_train_and_apply() -> None:
    """`--optim-stats-steps 2`: step 2's training and apply are measured, step 1's are not;
    the statistics change no result and no weight."""
    measured = make_trainer(optim_stats_steps=2)
    plain = make_trainer()
    outputs = {}
    for step in (1, 2):
        for trainer in (measured, plain):
            first = trainer.train(BatchId(0, 3), tokens(step), step, 1e-3, 1e-3)
            second = trainer.train(BatchId(4, 7), tokens(step + 10), step, 1e-3, 1e-3)
            assert first.result is not None and second.result is not None
            outputs[trainer] = (first.result, second.result)
            trainer.apply(list(outputs[trainer]), step, 1e-3)
        assert [r.encode() for r in outputs[measured]] == [r.encode() for r in outputs[plain]]
    assert measured.weights_digest() == plain.weights_digest()
    assert plain.optim_stats.take() == []
    taken = measured.optim_stats.take()
    assert [step for step, _ in taken] == [2]
    stats = taken[0][1]
    names = {name for name, _ in measured.model.named_parameters()}
    kinds = ("grad_energy", "delta_energy", "captured_energy", "index_overlap")
    assert set(stats) == {f"{name}.{kind}" for name in names for kind in kinds}
    assert all(0.0 <= stats[f"{name}.index_overlap"] <= 1.0 for name in names)
