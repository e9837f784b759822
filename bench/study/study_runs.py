"""One run of the optimizer study: AdamW, a compressed optimizer, or the DiLoCo ceiling.

`run_one(spec, corpus)` trains the protocol's model from `spec.seed` on the batches of that seed (the
same tokens, in the same order, whatever the optimizer; `simulation.Corpus`) and returns a
`RunOutcome`:

- AdamW: one central model; its validation loss every `eval_every` steps is the curve
  (tokens, loss) that says how many tokens AdamW needed to reach a loss.
- DisTrO / SparseLoCo: `spec.peers` replicas (`Trainer`s), each training its share of every
  step, results through the real byte codec. Pipelined (the client's): round r applies the
  results of round r - 2 and trains with the lookahead; `synchronous`: round r's results are
  applied before round r + 1 trains and nothing is in flight, so there is no lookahead (the
  trainers see steps 2, 4, 6, ...: their own last result is never one step old). Two replicas
  apply every result set independently and must stay bit-identical (`replicas_identical`);
  the others take their weights (an apply changes only the weights, and with DisTrO's
  `aggregate_momentum` a buffer that only apply reads, so this is the same as applying, at a
  fraction of the cost with 16 peers). Every `stats_every` rounds replica 0's
  compressed buffer gives the captured energy (the share of each tile's DCT energy its top-k
  kept, averaged over tiles) and the round's results their index overlap
  (`distro.stats`).
- DiLoCo (`diloco` set): every peer takes `inner_steps` AdamW steps from the shared weights,
  the exact mean of the dense float32 pseudo-gradients goes through outer SGD with Nesterov
  momentum; its bytes are a dense bf16 pseudo-gradient per round, with no framing.

API: `RunSpec`, `RunOutcome`, `run_one(spec, corpus) -> RunOutcome`, `save_corpus(corpus,
folder)` and `run_one_mapped(spec, train, valid)` (for worker processes).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from psyche_client.distro import DistroResult, DistroSettings
from psyche_client.distro.stats import captured_energy, index_overlap
from psyche_client.training.trainer import AdamWSettings, Trainer
from psyche_common.batch_id import BatchId

from bench.study.simulation import Corpus, build_model, cosine_schedule
from bench.study.study_protocol import CompressedSettings, DilocoSettings, StudyProtocol

APPLYING_REPLICAS = 2


@dataclass(frozen=True)
class RunSpec:
    protocol: StudyProtocol
    lr: float
    seed: int
    peers: int = 1
    settings: CompressedSettings | None = None
    diloco: DilocoSettings | None = None
    synchronous: bool = False

    def __post_init__(self) -> None:
        if self.settings is not None and self.diloco is not None:
            raise ValueError("a run is compressed or DiLoCo, not both")


@dataclass
class RunOutcome:
    initial_val: float
    final_val: float
    tokens: int
    curve: list[tuple[int, float]] = field(default_factory=list)
    payload_bytes_per_round: int = 0
    framing_bytes_per_round: int = 0
    tokens_per_peer_round: int = 0
    replicas_identical: bool = True
    captured_energy: float | None = None
    index_overlap: float | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """The training's CPU time (the study's sizing figure: wall time depends on the load)."""


def run_one(spec: RunSpec, corpus: Corpus) -> RunOutcome:
    """Train `spec` on `corpus` with one torch thread; `seconds` is the training's alone."""
    torch.set_num_threads(1)
    started, cpu_started = time.perf_counter(), time.process_time()
    if spec.diloco is not None:
        outcome = _run_diloco(spec, spec.diloco, corpus)
    elif spec.settings is not None:
        outcome = _run_compressed(spec, spec.settings, corpus)
    else:
        outcome = _run_adamw(spec, corpus)
    outcome.seconds = time.perf_counter() - started
    outcome.cpu_seconds = time.process_time() - cpu_started
    return outcome


def save_corpus(corpus: Corpus, folder: Path) -> tuple[Path, Path]:
    """Write `corpus` as two `.npy` files (loading the stdlib takes seconds; mapping these
    takes none, so every worker process of the study maps them instead)."""
    train, valid = folder / "train.npy", folder / "valid.npy"
    np.save(train, corpus.train)
    np.save(valid, corpus.valid)
    return train, valid


def run_one_mapped(spec: RunSpec, train: Path, valid: Path) -> RunOutcome:
    """`run_one` on the corpus of `save_corpus`'s files, memory-mapped."""
    corpus = Corpus(np.load(train, mmap_mode="r"), np.load(valid, mmap_mode="r"))
    return run_one(spec, corpus)


def _batches(spec: RunSpec) -> np.random.Generator:
    """The seed's batch order (the same draws whatever the optimizer)."""
    return np.random.default_rng(1234 + spec.seed)


def _run_adamw(spec: RunSpec, corpus: Corpus) -> RunOutcome:
    p = spec.protocol
    schedule = cosine_schedule(spec.lr, p.steps, p.warmup_steps, p.final_fraction)
    model = build_model(p.model.llama_config(), spec.seed)
    trainer = Trainer(model, AdamWSettings(), device="cpu", micro_batch_size=p.sequences_per_step)
    valid = corpus.validation(p.valid_windows, p.seq_len)
    initial = trainer.evaluate(valid)
    outcome = RunOutcome(initial, float("nan"), p.steps * p.tokens_per_step, [(0, initial)])
    rng = _batches(spec)
    for step in range(1, p.steps + 1):
        tokens = corpus.batch(rng, p.sequences_per_step, p.seq_len)
        batch = BatchId(0, p.sequences_per_step - 1)
        trainer.train(batch, tokens, step, schedule(step), schedule(step - 1))
        if step % p.eval_every == 0 or step == p.steps:
            outcome.curve.append((step * p.tokens_per_step, trainer.evaluate(valid)))
    outcome.final_val = outcome.curve[-1][1]
    return outcome


def _inner_steps(settings: CompressedSettings | DilocoSettings) -> int:
    if isinstance(settings, DistroSettings):
        return 1
    return settings.inner_steps


def _peer_shares(spec: RunSpec, corpus: Corpus, rng: np.random.Generator, inner: int) -> list:
    """One round's tokens, one `[inner * per_peer, seq_len]` array per peer."""
    p = spec.protocol
    per_peer = p.sequences_per_step // spec.peers
    tokens = np.stack([corpus.batch(rng, p.sequences_per_step, p.seq_len) for _ in range(inner)])
    return [
        tokens[:, r * per_peer : (r + 1) * per_peer].reshape(inner * per_peer, p.seq_len)
        for r in range(spec.peers)
    ]


def _run_compressed(spec: RunSpec, settings: CompressedSettings, corpus: Corpus) -> RunOutcome:
    p = spec.protocol
    inner = _inner_steps(settings)
    rounds = p.steps // inner
    schedule = cosine_schedule(
        spec.lr, rounds, max(1, round(p.warmup_steps / inner)), p.final_fraction
    )
    base = build_model(p.model.llama_config(), spec.seed)
    per_peer = p.sequences_per_step // spec.peers
    trainers = [
        Trainer(copy.deepcopy(base), settings, device="cpu", micro_batch_size=per_peer)
        for _ in range(spec.peers)
    ]
    valid = corpus.validation(p.valid_windows, p.seq_len)
    outcome = RunOutcome(trainers[0].evaluate(valid), float("nan"), p.steps * p.tokens_per_step)
    outcome.tokens_per_peer_round = inner * per_peer * p.seq_len
    rng = _batches(spec)
    in_flight: dict[int, list[DistroResult]] = {}
    energies: list[float] = []
    overlaps: list[float] = []

    def apply(results: list[DistroResult], step: int, lr: float) -> None:
        appliers = trainers[:APPLYING_REPLICAS]
        for trainer in appliers:
            trainer.apply(results, step, lr)
        outcome.replicas_identical &= len({t.weights_hash() for t in appliers}) == 1
        with torch.no_grad():
            source = list(trainers[0].model.parameters())
            for trainer in trainers[APPLYING_REPLICAS:]:
                for dst, src in zip(trainer.model.parameters(), source, strict=True):
                    dst.copy_(src)

    for r in range(1, rounds + 1):
        # synchronous: steps 2, 4, ... so that no own result is one step old (no lookahead)
        step = 2 * r if spec.synchronous else r
        if not spec.synchronous and r > 2:
            apply(in_flight.pop(r - 2), r, schedule(r))
        results = []
        for i, (trainer, share) in enumerate(
            zip(trainers, _peer_shares(spec, corpus, rng, inner), strict=True)
        ):
            first = i * per_peer
            out = trainer.train(
                BatchId(first, first + per_peer - 1), share, step, schedule(r), schedule(r - 1)
            )
            assert out.result is not None
            blob = out.result.encode()
            outcome.payload_bytes_per_round = out.result.payload_bytes()
            outcome.framing_bytes_per_round = len(blob) - outcome.payload_bytes_per_round
            results.append(trainer.decode_result(blob))
        if p.stats_every and r % p.stats_every == 0:
            energies.append(_captured_energy(trainers[0], results[0]))
            overlap = _index_overlap(trainers[0], results)
            if overlap is not None:
                overlaps.append(overlap)
        if spec.synchronous:
            apply(results, step, schedule(r))
        else:
            in_flight[r] = results
    if not spec.synchronous:  # the two apply-only rounds that flush the pipeline
        for r in (rounds + 1, rounds + 2):
            if r - 2 in in_flight:
                apply(in_flight.pop(r - 2), r, schedule(r))
    outcome.final_val = trainers[0].evaluate(valid)
    outcome.captured_energy = float(np.mean(energies)) if energies else None
    outcome.index_overlap = float(np.mean(overlaps)) if overlaps else None
    return outcome


def _captured_energy(trainer: Trainer, result: DistroResult) -> float:
    """The mean over every tile of every tensor of the share of the compressed buffer's DCT
    energy that `result` (the buffer's own top-k) kept."""
    optimizer = trainer.distro
    shares = []
    for i, tensor in enumerate(optimizer.layout.tensors):
        if isinstance(optimizer.settings, DistroSettings):
            buffer = optimizer.momentum(tensor.name)  # type: ignore[union-attr]
        else:
            buffer = optimizer.error_buffer(tensor.name)  # type: ignore[union-attr]
        coefficients = optimizer.compressor.coefficients(i, buffer)
        idx = torch.from_numpy(np.array(result.tensors[i].indices())).to(torch.int64)
        kept = coefficients.gather(-1, idx)
        shares.append(captured_energy(coefficients, kept))
    return float(torch.cat(shares).mean())


def _index_overlap(trainer: Trainer, results: list[DistroResult]) -> float | None:
    """The mean over tensors of the round's results' index overlap (`distro.stats`)."""
    values = [
        index_overlap([r.tensors[i].indices() for r in results], tensor.totalk)
        for i, tensor in enumerate(trainer.layout.tensors)
    ]
    measured = [v for v in values if v is not None]
    return float(np.mean(measured)) if measured else None


def _run_diloco(spec: RunSpec, diloco: DilocoSettings, corpus: Corpus) -> RunOutcome:
    p = spec.protocol
    rounds = p.steps // diloco.inner_steps
    schedule = cosine_schedule(
        spec.lr, rounds, max(1, round(p.warmup_steps / diloco.inner_steps)), p.final_fraction
    )
    base = build_model(p.model.llama_config(), spec.seed)
    per_peer = p.sequences_per_step // spec.peers
    peers = [
        Trainer(copy.deepcopy(base), AdamWSettings(), device="cpu", micro_batch_size=per_peer)
        for _ in range(spec.peers)
    ]
    shared = [param.detach().clone() for param in base.parameters()]
    momentum = [torch.zeros_like(param) for param in shared]
    valid = corpus.validation(p.valid_windows, p.seq_len)
    outcome = RunOutcome(peers[0].evaluate(valid), float("nan"), p.steps * p.tokens_per_step)
    params = sum(param.numel() for param in shared)
    outcome.payload_bytes_per_round = 2 * params  # a dense bf16 pseudo-gradient
    outcome.tokens_per_peer_round = diloco.inner_steps * per_peer * p.seq_len
    rng = _batches(spec)
    for r in range(1, rounds + 1):
        mean_delta = [torch.zeros_like(param) for param in shared]
        for i, (peer, share) in enumerate(
            zip(peers, _peer_shares(spec, corpus, rng, diloco.inner_steps), strict=True)
        ):
            _load(peer, shared)
            first = i * per_peer
            for part in np.split(share, diloco.inner_steps):
                batch = BatchId(first, first + per_peer - 1)
                peer.train(batch, part, r, schedule(r), schedule(r - 1))
            with torch.no_grad():
                for total, start, param in zip(
                    mean_delta, shared, peer.model.parameters(), strict=True
                ):
                    total.add_(start - param, alpha=1.0 / spec.peers)
        with torch.no_grad():
            for param, m, g in zip(shared, momentum, mean_delta, strict=True):
                m.mul_(diloco.outer_momentum).add_(g)
                param.sub_(g.add(m, alpha=diloco.outer_momentum), alpha=diloco.outer_lr)
    _load(peers[0], shared)
    outcome.final_val = peers[0].evaluate(valid)
    return outcome


def _load(trainer: Trainer, weights: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for param, value in zip(trainer.model.parameters(), weights, strict=True):
            param.copy_(value)
