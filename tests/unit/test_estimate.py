"""Run estimate: the result size against what the result codec encodes, and the memory table's
composition."""

from __future__ import annotations

import pytest
from psyche_client.distro import DistroOptimizer as DistroTrainerOptimizer
from psyche_client.distro import DistroSettings
from psyche_client.distro.size import encoded_result_size
from psyche_client.distro.sparseloco import SparseLocoOptimizer as SparseLocoTrainerOptimizer
from psyche_client.distro.sparseloco import SparseLocoSettings
from psyche_client.tools.estimate import Estimate, estimate_run
from psyche_client.training.model.loading import build_model_from_config, builtin_config
from psyche_client.training.model.precision import Precision
from psyche_client.training.parallel.collectives import BUCKET_ELEMENTS
from psyche_client.training.parallel.plan import ParallelSpec
from psyche_common.batch_id import BatchId
from psyche_common.config import AdamWOptimizer, DistroOptimizer, SparseLocoOptimizer

from tests.support.tiny_distro import set_random_grads


class LLM:
    """Duck-typed stand-in for LLMConfig (only the fields estimate_run reads)."""

    def __init__(self, optimizer, max_seq_len: int = 2048) -> None:
        self.optimizer = optimizer
        self.max_seq_len = max_seq_len


def distro(chunk: int, topk: int, one_bit: bool) -> DistroOptimizer:
    return DistroOptimizer(
        compression_decay=0.999,
        compression_topk=topk,
        compression_chunk=chunk,
        quantize_1bit=one_bit,
    )


SPARSELOCO = {
    "inner_steps": 5,
    "outer_lr": 1.0,
    "compression_decay": 0.95,
    "compression_topk": 32,
    "compression_chunk": 64,
    "quantize_2bit": True,
    "betas": (0.9, 0.95),
    "weight_decay": 0.1,
    "eps": 1e-8,
}


@pytest.mark.parametrize(
    ("chunk", "topk", "one_bit"), [(64, 8, True), (16, 4, False)], ids=["1bit", "bf16"]
)
def test_the_distro_result_size_is_what_the_client_encodes(chunk, topk, one_bit) -> None:
    """`check`'s upload per step is the length of a result the client really encodes for this
    model and these settings (its trainer's optimizer, real gradients of the preset)."""
    config = distro(chunk, topk, one_bit)
    estimate = estimate_run(LLM(config, 256), builtin_config("llama-2m"), 1, "cpu")
    model = build_model_from_config(builtin_config("llama-2m"))
    optimizer = DistroTrainerOptimizer(model.named_parameters(), DistroSettings.from_config(config))
    set_random_grads(model, 1)
    result = optimizer.generate(0.1, 3, BatchId(0, 7), 0).transmit
    assert estimate.distro_result_bytes == len(result.encode())


@pytest.mark.parametrize(
    "spelling",
    [{"quantize_1bit": False, "quantize_2bit": True}, {"value_format": "2-bit"}],
    ids=["booleans", "value_format"],
)
def test_a_two_bit_distro_result_size_is_the_two_bit_codecs(spelling: dict[str, object]) -> None:
    """The value format comes from the table's one resolution (`value_format` or the
    booleans): a 2-bit DisTrO run is estimated at its 2-bit size, not at bf16's."""
    config = DistroOptimizer(
        compression_decay=0.999, compression_topk=8, compression_chunk=64, **spelling
    )
    estimate = estimate_run(LLM(config, 256), builtin_config("llama-2m"), 1, "cpu")
    model = build_model_from_config(builtin_config("llama-2m"))
    settings = DistroSettings.from_config(config)
    optimizer = DistroTrainerOptimizer(model.named_parameters(), settings)
    assert optimizer.layout.value_kind.codec.name == "2-bit"
    set_random_grads(model, 1)
    result = optimizer.generate(0.1, 3, BatchId(0, 7), 0).transmit
    assert estimate.distro_result_bytes == len(result.encode())


def test_the_sparseloco_result_size_is_the_codecs() -> None:
    """SparseLoCo's result (2-bit values) as its trainer's optimizer lays it out; the codec's
    size of a layout is the encoded length (tests/unit/test_distro_size.py)."""
    for two_bit in (True, False):
        config = SparseLocoOptimizer(**(SPARSELOCO | {"quantize_2bit": two_bit}))
        estimate = estimate_run(LLM(config, 256), builtin_config("llama-2m"), 1, "cpu")
        model = build_model_from_config(builtin_config("llama-2m"))
        settings = SparseLocoSettings.from_config(config)
        optimizer = SparseLocoTrainerOptimizer(model.named_parameters(), settings)
        assert estimate.distro_result_bytes == encoded_result_size(optimizer.layout)


def test_the_20m_preset_sends_the_documented_result_size() -> None:
    """docs/distro.md and docs/operations.md quote 63,386 bytes for `builtin:llama-20m` with
    the example settings (chunk 64, top-k 8, 1-bit): the codec's size, which check prints."""
    estimate = estimate_run(LLM(distro(64, 8, True)), builtin_config("llama-20m"), 1)
    assert estimate.num_parameters == 19_794_176
    assert estimate.distro_result_bytes == 63_386
    assert "63,386 bytes" in estimate.render()


def test_memory_components_by_optimizer() -> None:
    config = builtin_config("llama-2m")
    bf16 = Precision(dtype="bf16")
    d = estimate_run(LLM(distro(64, 8, True), 512), config, 2, "cpu", num_clients=3, precision=bf16)
    rows = dict(d.memory)
    weights = d.num_parameters * 2  # bf16
    assert rows["parameters"] == rows["gradients"] == weights
    assert rows["DisTrO momentum (fp32)"] == 2 * weights
    assert rows["saved weights (lookahead undo)"] == rows["weights snapshot (early apply)"]
    assert rows["results held (own encoded, every client's for 2 rounds)"] == (
        7 * d.distro_result_bytes
    )
    assert rows["process baseline (python, torch, transformers)"] > 50 * 1024**2
    assert d.distro_download_bytes_per_step == 2 * d.distro_result_bytes
    # the CPU default is fp32: every weight-sized row doubles, the fp32 momentum does not
    fp32 = dict(estimate_run(LLM(distro(64, 8, True), 512), config, 2, "cpu").memory)
    assert fp32["parameters"] == 2 * weights and fp32["DisTrO momentum (fp32)"] == 2 * weights
    summed = estimate_run(
        LLM(distro(64, 8, True), 512),
        config,
        2,
        "cpu",
        precision=Precision(dtype="bf16", grad_accum_in_fp32=True),
    )
    assert dict(summed.memory)["fp32 gradient sums (--grad-accum-in-fp32)"] == 2 * weights

    a = estimate_run(
        LLM(AdamWOptimizer(betas=(0.9, 0.95), weight_decay=0.0, eps=1e-8), 512),
        config,
        2,
        precision=bf16,
    )
    assert dict(a.memory)["AdamW moments"] == 2 * weights
    assert a.distro_result_bytes is None

    s = estimate_run(
        LLM(SparseLocoOptimizer(**SPARSELOCO), 512), config, 2, num_clients=3, precision=bf16
    )
    assert dict(s.memory)["AdamW moments (inner steps)"] == 2 * weights
    assert dict(s.memory)["SparseLoCo error feedback (fp32)"] == 2 * weights
    assert (
        s.distro_result_bytes is not None and 0 < s.distro_result_bytes < d.distro_result_bytes * 8
    )

    bigger = estimate_run(LLM(distro(64, 8, True), 512), config, 4, precision=bf16)
    for row in ("activations (one micro-batch)", "logits and loss (one micro-batch)"):
        assert dict(bigger.memory)[row] == 2 * rows[row]
    checkpointed = estimate_run(
        LLM(distro(64, 8, True), 512),
        config,
        2,
        precision=Precision(dtype="bf16", activation_checkpointing=True),
    )
    assert (
        dict(checkpointed.memory)["activations (one micro-batch)"]
        < 0.5 * rows["activations (one micro-batch)"]
    )
    eager = estimate_run(
        LLM(distro(64, 8, True), 512),
        config,
        2,
        precision=Precision(dtype="bf16", attn_implementation="eager"),
    )
    assert (
        dict(eager.memory)["activations (one micro-batch)"] > rows["activations (one micro-batch)"]
    )


def test_render_and_fit_verdict() -> None:
    estimate = estimate_run(LLM(distro(64, 8, True), 512), builtin_config("llama-tiny"), 1)
    text = estimate.render()
    assert "memory: total" in text and "DisTrO upload per step" in text
    assert estimate.free_bytes is not None and estimate.free_bytes > 0
    assert estimate.fits is True
    assert "fits" in text and "yes" in text


def test_bad_micro_batch() -> None:
    with pytest.raises(ValueError, match="micro_batch_size"):
        estimate_run(LLM(distro(64, 8, True)), builtin_config("llama-tiny"), 0)


BF16 = Precision(dtype="bf16")
BASELINE = "process baseline (python, torch, transformers)"


def without_baseline(estimate: Estimate) -> int:
    """The estimate's total less the process baseline (this process's memory, which moves)."""
    return estimate.total_bytes - dict(estimate.memory)[BASELINE]


def test_per_device_memory_for_each_parallel_layout() -> None:
    """Replicas hold what one device holds plus the fp32 all-reduce bucket (at most
    `BUCKET_ELEMENTS`); sharding over N
    ranks cuts the model's share per device to about 1/N (owned copies, momentum and shards),
    plus the unsharded root and two layers while training."""
    config = builtin_config("llama-20m")
    llm = LLM(distro(64, 8, True), 512)
    single = estimate_run(llm, config, 1, "cpu", precision=BF16)
    replicated = estimate_run(llm, config, 1, "cpu", parallel=ParallelSpec(2), precision=BF16)
    sharded = {
        n: estimate_run(llm, config, 1, "cpu", parallel=ParallelSpec(n, fsdp=True), precision=BF16)
        for n in (2, 4)
    }
    rows = dict(replicated.memory)
    bucket = min(single.num_parameters, BUCKET_ELEMENTS) * 4
    assert rows["gradient all-reduce bucket (fp32)"] == bucket
    assert without_baseline(replicated) == without_baseline(single) + bucket
    weights = single.num_parameters * 2  # bf16
    for ranks, estimate in sharded.items():
        rows = dict(estimate.memory)
        assert rows["parameter shards"] == pytest.approx(weights / ranks, rel=0.01)
        assert "saved weights (lookahead undo)" not in rows
    # DisTrO state is owned by whole parameters: two ranks split it about evenly; with four,
    # the rank that owns the 32000 x 256 embedding holds more than a quarter
    assert dict(sharded[2].memory)["full copies of owned parameters"] == pytest.approx(
        weights / 2, rel=0.1
    )
    assert dict(sharded[4].memory)["full copies of owned parameters"] == 32000 * 256 * 2
    text = sharded[2].render()
    assert "2 ranks on cpu, model sharded (--fsdp)" in text
    assert "memory per device: parameter shards" in text
    # CPU ranks share the host's memory: all of them must fit into it together
    assert sharded[2].needed_bytes == 2 * sharded[2].total_bytes
    assert "memory of all 2 ranks (shared)" in text


TINYLLAMA_1B = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}


def test_sharding_a_1b_model_cuts_its_memory_per_device() -> None:
    llm = LLM(distro(64, 8, True), 2048)
    single = estimate_run(llm, TINYLLAMA_1B, 1, "cpu", precision=BF16)
    transient = (
        "activations (one micro-batch)",
        "logits and loss (one micro-batch)",
        "DisTrO generate working memory (largest parameter)",
        "DisTrO apply working memory (largest parameter)",
    )
    activations = sum(dict(single.memory)[row] for row in transient)
    model = without_baseline(single) - activations
    for ranks in (2, 4, 8):
        estimate = estimate_run(
            llm, TINYLLAMA_1B, 1, "cpu", parallel=ParallelSpec(ranks, fsdp=True), precision=BF16
        )
        assert sum(dict(estimate.memory)[row] for row in transient) == activations
        per_device = without_baseline(estimate) - activations
        assert per_device < model * (1.3 / ranks + 0.1), ranks


def test_parallel_estimate_needs_distro() -> None:
    adamw = AdamWOptimizer(betas=(0.9, 0.95), weight_decay=0.0, eps=1e-8)
    with pytest.raises(ValueError, match="DisTrO only"):
        estimate_run(LLM(adamw), builtin_config("llama-tiny"), 1, parallel=ParallelSpec(2))


@pytest.mark.parametrize("parallel", [None, ParallelSpec(2, fsdp=True)], ids=["one", "sharded"])
def test_tied_embeddings_are_counted_once(parallel: ParallelSpec | None) -> None:
    """A tied model (TinyLlama's shape with the output embedding tied) holds, trains and sends
    its embedding once: its parameters and DisTrO traffic are one embedding smaller."""
    llm = LLM(distro(64, 8, True), 2048)
    untied = estimate_run(llm, TINYLLAMA_1B, 1, "cpu", parallel=parallel)
    tied = estimate_run(
        llm, TINYLLAMA_1B | {"tie_word_embeddings": True}, 1, "cpu", parallel=parallel
    )
    embedding = 32000 * 2048
    assert tied.num_parameters == untied.num_parameters - embedding
    assert tied.total_bytes < untied.total_bytes - 2 * embedding  # bf16 weights and gradients
    assert tied.distro_result_bytes is not None and untied.distro_result_bytes is not None
    assert tied.distro_result_bytes < untied.distro_result_bytes
