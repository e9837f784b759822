"""In-process simulation of DisTrO peers (and an AdamW baseline) through the `Trainer` API.

Used by the convergence test and `bench/distro.py`: several `Trainer` replicas of one tiny
Llama train the same global batch split between them, exchange their results through the real
byte codec, and apply them with the pipeline of the reference (spec 1.7): at step S apply the
results of step S-2 with lr(S), train with the lookahead of lr(S-1), flush the last two steps
at the end. The weights of every replica are compared (SHA-256) after every step.

Data: byte-level tokens of the Python standard library's own `*.py` files (no network), the
last `valid_fraction` held out; validation = fixed, evenly spaced windows of that tail.

API: `load_stdlib_corpus(valid_fraction=0.05) -> Corpus`, `prototype_llama_config()`,
`cosine_schedule(peak, steps, warmup=20)`, `run_adamw(...)`, `run_distro(...)` -> `RunReport`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import transformers
from psyche_client.distro import DistroResult, DistroSettings
from psyche_client.distro.sparseloco import SparseLocoSettings
from psyche_client.training.trainer import AdamWSettings, Trainer
from psyche_common.batch_id import BatchId
from psyche_common.config import CosineLR
from psyche_common.data.builtin import python_stdlib_files
from psyche_common.lr_schedule import lr_at


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray  # uint8 bytes
    valid: np.ndarray

    def batch(self, rng: np.random.Generator, n: int, seq_len: int) -> np.ndarray:
        starts = rng.integers(0, len(self.train) - seq_len, size=n)
        return np.stack([self.train[s : s + seq_len] for s in starts]).astype(np.int64)

    def validation(self, n: int, seq_len: int) -> np.ndarray:
        starts = np.linspace(0, len(self.valid) - seq_len, n).astype(np.int64)
        return np.stack([self.valid[s : s + seq_len] for s in starts]).astype(np.int64)


def load_stdlib_corpus(valid_fraction: float = 0.05) -> Corpus:
    """Every stdlib `*.py` (site-packages excluded), sorted by path, concatenated as bytes:
    the files of the `python-stdlib` data provider, split here by `valid_fraction`."""
    files = python_stdlib_files()
    data = np.frombuffer(b"".join(path.read_bytes() for path in files), dtype=np.uint8)
    cut = int(len(data) * (1.0 - valid_fraction))
    return Corpus(train=data[:cut], valid=data[cut:])


REFERENCE_DISTRO = DistroSettings(
    compression_decay=0.999,
    compression_topk=8,
    compression_chunk=64,
    quantize_1bit=True,
    clip_grad_norm=1.0,
)
"""The reference's DisTrO settings (chunk 64, top-k 8, 1-bit, decay 0.999, clip 1.0): the
simulations' default."""


def prototype_llama_config() -> transformers.LlamaConfig:
    """The prototype's model: byte vocab, hidden 128, 4 layers, 4 heads (~0.92M params)."""
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )


def build_model(config: transformers.LlamaConfig, seed: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config)


def cosine_schedule(
    peak: float, steps: int, warmup: int = 20, final_fraction: float = 0.1
) -> Callable[[int], float]:
    """Warmup from 0 over `warmup` steps, then cosine to `final_fraction` x peak at `steps`."""
    schedule = CosineLR(
        base_lr=peak,
        warmup_init_lr=0.0,
        final_lr=final_fraction * peak,
        warmup_steps=warmup,
        total_steps=steps,
    )
    return lambda step: lr_at(schedule, step)


@dataclass
class RunReport:
    method: str
    steps: int
    initial_val: float
    final_val: float
    train_losses: list[float] = field(default_factory=list)
    payload_bytes_per_peer: int = 0  # per round
    blob_bytes_per_peer: int = 0
    tokens_per_peer_round: int = 0
    replicas_identical: bool = True
    forward_backward_seconds: float = 0.0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    seconds: float = 0.0


def run_adamw(
    corpus: Corpus,
    steps: int,
    *,
    lr: float = 1e-3,
    batch: int = 8,
    seq_len: int = 256,
    seed: int = 0,
    valid_windows: int = 128,
    config: transformers.LlamaConfig | None = None,
) -> RunReport:
    """Central AdamW baseline (betas 0.9/0.95, wd 0.1, clip 1.0) on the same batches."""
    schedule = cosine_schedule(lr, steps)
    trainer = Trainer(
        build_model(config or prototype_llama_config(), seed),
        AdamWSettings(),
        device="cpu",
        micro_batch_size=batch,
    )
    valid = corpus.validation(valid_windows, seq_len)
    report = RunReport("adamw", steps, trainer.evaluate(valid), float("nan"))
    rng = np.random.default_rng(1234 + seed)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        tokens = corpus.batch(rng, batch, seq_len)
        out = trainer.train(BatchId(0, batch - 1), tokens, step, schedule(step), schedule(step - 1))
        report.train_losses.append(out.loss)
        report.forward_backward_seconds += out.forward_backward_seconds
    report.seconds = time.perf_counter() - started
    report.final_val = trainer.evaluate(valid)
    return report


def run_distro(
    corpus: Corpus,
    steps: int,
    *,
    lr: float = 3e-3,
    peers: int = 4,
    batch: int = 8,
    seq_len: int = 256,
    seed: int = 0,
    settings: DistroSettings | SparseLocoSettings | None = None,
    valid_windows: int = 128,
    config: transformers.LlamaConfig | None = None,
    warmup: int = 20,
    final_fraction: float = 0.1,
) -> RunReport:
    """`peers` DisTrO (or SparseLoCo) replicas, each training `batch // peers` sequences of
    every step of `batch` sequences, through the real pipeline.

    With SparseLoCo's `inner_steps = H` a round spans H of those steps (each peer takes one
    AdamW step on its share of each), so the run has `steps / H` rounds and sees exactly the
    tokens, in the same order, of `run_adamw` with the same `steps` and seed. The schedule
    then counts rounds: `lr` peaks after `warmup / H` of them.
    """
    if batch % peers:
        raise ValueError(f"batch {batch} must split evenly over {peers} peers")
    inner = settings.inner_steps if isinstance(settings, SparseLocoSettings) else 1
    if steps % inner:
        raise ValueError(f"steps {steps} must be a multiple of inner_steps {inner}")
    rounds = steps // inner
    settings = settings or REFERENCE_DISTRO
    schedule = cosine_schedule(lr, rounds, max(1, round(warmup / inner)), final_fraction)
    base = build_model(config or prototype_llama_config(), seed)
    per_peer = batch // peers
    trainers = [
        Trainer(copy.deepcopy(base), settings, device="cpu", micro_batch_size=per_peer)
        for _ in range(peers)
    ]
    valid = corpus.validation(valid_windows, seq_len)
    report = RunReport("distro", steps, trainers[0].evaluate(valid), float("nan"))
    rng = np.random.default_rng(1234 + seed)
    in_flight: dict[int, list[DistroResult]] = {}
    started = time.perf_counter()

    def apply_step(applying_step: int, produced_at: int) -> None:
        results = in_flight.pop(produced_at, [])
        t0 = time.perf_counter()
        for trainer in trainers:
            trainer.apply(results, applying_step, schedule(applying_step))
        report.decode_seconds += (time.perf_counter() - t0) / peers
        hashes = {trainer.weights_hash() for trainer in trainers}
        report.replicas_identical &= len(hashes) == 1

    report.tokens_per_peer_round = inner * per_peer * seq_len
    for step in range(1, rounds + 1):
        if step - 2 >= 1:
            apply_step(step, step - 2)
        tokens = np.stack([corpus.batch(rng, batch, seq_len) for _ in range(inner)])
        losses, produced = [], []
        for r, trainer in enumerate(trainers):
            first = r * per_peer
            share = tokens[:, first : first + per_peer].reshape(inner * per_peer, seq_len)
            out = trainer.train(
                BatchId(first, first + per_peer - 1),
                share,
                step,
                schedule(step),
                schedule(step - 1),
            )
            assert out.result is not None
            t0 = time.perf_counter()
            blob = out.result.encode()
            received = trainer.decode_result(blob)
            report.encode_seconds += (time.perf_counter() - t0) / peers
            report.forward_backward_seconds += out.forward_backward_seconds
            report.encode_seconds += out.optimizer_seconds / peers
            report.payload_bytes_per_peer = out.result.payload_bytes()
            report.blob_bytes_per_peer = len(blob)
            losses.append(out.loss)
            produced.append(received)
        in_flight[step] = produced
        report.train_losses.append(float(np.mean(losses)))
    apply_step(rounds + 1, rounds - 1)  # the two apply-only rounds that flush the pipeline
    apply_step(rounds + 2, rounds)
    report.seconds = time.perf_counter() - started
    report.final_val = trainers[0].evaluate(valid)
    return report
