"""Run estimate: DisTrO sizes against the spec's exact table (client spec 1.10) and the memory
table's composition."""

from __future__ import annotations

import pytest
from psyche_client.model.estimate import (
    chunk_size,
    distro_tensor_size,
    estimate_run,
)
from psyche_client.model.loading import builtin_config
from psyche_common.config import AdamWOptimizer, DistroOptimizer, SparseLocoOptimizer


@pytest.mark.parametrize(
    ("dimension", "target", "expected"),
    [
        (12, 5, 4),
        (100, 7, 5),
        (100, 26, 25),
        (100, 101, 100),
        (10**9 + 7, 5 * 10**8, 1),
        (688, 64, 43),
        (11008, 64, 64),
        (344, 16, 8),
        (100, 16, 10),
    ],
)
def test_chunk_size(dimension: int, target: int, expected: int) -> None:
    assert chunk_size(dimension, target) == expected


@pytest.mark.parametrize(
    ("shape", "chunk", "topk", "one_bit", "payload", "serialized"),
    [
        ((32000, 256), 64, 8, True, 34_000, 34_029),
        ((32000, 256), 64, 8, False, 64_000, 64_030),
        ((32000, 256), 16, 4, False, 384_000, 384_030),
        ((256, 256), 64, 8, True, 272, 296),
        ((768, 256), 64, 8, False, 1_536, 1_561),
        ((256,), 64, 8, True, 36, 54),
        ((4096, 4096), 64, 8, True, 69_632, 69_662),
        ((11008, 4096), 64, 8, True, 187_136, 187_167),
        ((688, 256), 64, 8, True, 1_088, 1_112),
    ],
)
def test_distro_tensor_sizes_match_spec_table(shape, chunk, topk, one_bit, payload, serialized):
    size = distro_tensor_size(shape, chunk, topk, one_bit)
    assert (size.payload, size.serialized) == (payload, serialized)


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


@pytest.mark.parametrize(
    ("chunk", "topk", "one_bit", "kilobytes"),
    [(64, 8, True, 83.4), (64, 8, False, 156), (16, 4, False, 930), (64, 4, True, 42)],
)
def test_llama20m_blob_sizes_match_spec(chunk, topk, one_bit, kilobytes) -> None:
    estimate = estimate_run(LLM(distro(chunk, topk, one_bit)), builtin_config("llama-20m"), 1)
    assert estimate.num_parameters == 19_794_176
    assert estimate.distro_result_bytes == pytest.approx(kilobytes * 1000, rel=0.01)


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


def test_memory_components_by_optimizer() -> None:
    config = builtin_config("llama-2m")
    d = estimate_run(LLM(distro(64, 8, True), 512), config, 2, "cpu", num_clients=3)
    labels = [label for label, _ in d.memory]
    assert "DisTrO momentum" in labels and "peer results (2 rounds)" in labels
    weights = d.num_parameters * 2  # bf16
    assert dict(d.memory)["parameters"] == weights
    assert d.distro_download_bytes_per_step == 2 * d.distro_result_bytes

    a = estimate_run(
        LLM(AdamWOptimizer(betas=(0.9, 0.95), weight_decay=0.0, eps=1e-8), 512), config, 2
    )
    assert dict(a.memory)["AdamW moments"] == 2 * weights
    assert a.distro_result_bytes is None

    s = estimate_run(LLM(SparseLocoOptimizer(**SPARSELOCO), 512), config, 2, num_clients=3)
    assert dict(s.memory)["AdamW moments (inner steps)"] == 2 * weights
    assert dict(s.memory)["SparseLoCo error feedback"] == weights
    assert (
        s.distro_result_bytes is not None and 0 < s.distro_result_bytes < d.distro_result_bytes * 8
    )

    bigger = estimate_run(LLM(distro(64, 8, True), 512), config, 4)
    assert (
        dict(bigger.memory)["activations (one micro-batch)"]
        > dict(d.memory)["activations (one micro-batch)"]
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
