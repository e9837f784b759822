"""The optimizer-quality study's protocol (issue 22): what is trained, how long, and what swept.

`PROTOCOL` is the study `bench/distro.py --study` runs; `QUICK_PROTOCOL` the same code path at
a size of seconds (`--study --quick`, run by `make test`: its numbers mean nothing).

The study (`study_runner.run_protocol`):

1. **Sweep**, on `sweep_seed` with `sweep_peers` simulated peers: AdamW at each of
   `adamw_lrs`, every candidate at each of its `lrs`. The lowest final validation loss picks
   each one's learning rate (the tuned AdamW is AdamW's winner).
2. **Seeds**: the tuned AdamW and every candidate's winner, each at every peer count of
   `peers`, on the fresh `seeds` (none of them the sweep seed).
3. **Diagnostics** on the same fresh seeds: with `synchronous_diagnostic`, every candidate's
   winner at `sweep_peers` without the two-round pipeline delay (results applied before the
   next step, no lookahead), which measures the delay's share; with `diloco`, DiLoCo at each
   peer count (dense float32 pseudo-gradients averaged exactly, outer SGD with Nesterov
   momentum), the ceiling of every compressed local-steps optimizer.

Sizing: one short run of each row kind at `PROTOCOL`'s size (40 steps, 2026-11-26 03:38 UTC,
development VM, 2 CPU cores shared with other work at load average 6, one torch thread),
in CPU milliseconds per step of 2,048 tokens (`RunOutcome.cpu_seconds`; wall time was 2 to 6
times that under this load): AdamW 96; DisTrO 207 with 4 peers, 444 with 16 (with the study's
apply shortcut, `study_runs`), 186 synchronous with 4; SparseLoCo (H 5) 130 with 4 peers,
287 with 16, 123 synchronous with 4; DiLoCo (H 5) 106 with 4 peers, 200 with 16. The sweep
(3 x (AdamW + DisTrO 4 + SparseLoCo 4)) costs 1.3 s per protocol step, the seeds stage
(3 x (AdamW + both candidates at 4 and 16 peers)) 3.5 s, the diagnostics (3 x (both
synchronous at 4 + DiLoCo at 4 and 16)) 1.8 s: 6.6 CPU seconds per step in all. At 600 steps
that is 66 CPU minutes, about 33 minutes with `--jobs 2` on two free cores, so `PROTOCOL`
runs 600 steps (5 tokens per parameter); the issue's 1,200 steps (10 tokens per parameter)
fit 40 minutes without the diagnostics only on a faster machine (`--steps 1200
--no-diagnostics`: 4.8 CPU s per step, 48 minutes on two free cores). Measured in the full
study of 2026-11-26 (every run's own CPU time, `run_cpu_seconds`): `PROTOCOL`'s 39 runs,
with the DiLoCo outer-lr sweep, took 3,140 CPU s (about 26 minutes on two free cores); the
variants' runs 6,810 CPU s more.

API: `ModelShape`, `Candidate`, `DilocoSettings`, `StudyProtocol`, `PROTOCOL`,
`VARIANT_CANDIDATES`, `QUICK_PROTOCOL`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import transformers
from psyche_client.distro import DistroSettings
from psyche_client.distro.sparseloco import SparseLocoSettings

CompressedSettings = DistroSettings | SparseLocoSettings


@dataclass(frozen=True)
class ModelShape:
    """A byte-level Llama (vocabulary 256, untied embeddings)."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int = 512

    def llama_config(self) -> transformers.LlamaConfig:
        return transformers.LlamaConfig(
            vocab_size=256,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.heads,
            max_position_embeddings=self.max_positions,
            tie_word_embeddings=False,
        )


@dataclass(frozen=True)
class Candidate:
    """A compressed optimizer under study: its settings and the learning rates swept."""

    name: str
    settings: CompressedSettings
    lrs: tuple[float, ...]
    peers: tuple[int, ...] | None = None
    """Peer counts of its fresh-seed runs (None: the protocol's `peers`)."""
    synchronous_diagnostic: bool = True
    """Whether the protocol's synchronous diagnostic runs it (when that is on)."""

    def __post_init__(self) -> None:
        if not self.lrs:
            raise ValueError(f"candidate {self.name!r}: no learning rate to sweep")
        if self.peers is not None and not self.peers:
            raise ValueError(f"candidate {self.name!r}: peers must name at least one count")


@dataclass(frozen=True)
class DilocoSettings:
    """The DiLoCo ceiling: `inner_steps` local AdamW steps (betas 0.9/0.95, weight decay 0.1,
    clip 1.0, like SparseLoCo's), the dense pseudo-gradients averaged exactly, then
    `theta -= outer_lr * (g + outer_momentum * m)` with `m = outer_momentum * m + g`
    (Nesterov). Its inner learning rate is the tuned one of candidate `lr_of`."""

    inner_steps: int
    outer_lr: float
    outer_momentum: float
    lr_of: str


@dataclass(frozen=True)
class StudyProtocol:
    model: ModelShape
    seq_len: int
    sequences_per_step: int
    """Global batch of one step (split evenly over the peers)."""
    steps: int
    warmup_steps: int
    final_fraction: float
    """The cosine schedule ends at this fraction of the peak learning rate."""
    eval_every: int
    """Steps between two points of AdamW's validation curve (tokens to reach a loss)."""
    valid_windows: int
    adamw_lrs: tuple[float, ...]
    candidates: tuple[Candidate, ...]
    sweep_peers: int
    peers: tuple[int, ...]
    sweep_seed: int
    seeds: tuple[int, ...]
    synchronous_diagnostic: bool
    diloco: DilocoSettings | None
    diloco_outer_lrs: tuple[float, ...]
    """DiLoCo's outer learning rates swept on `sweep_seed` with `sweep_peers` (its inner one
    being `lr_of`'s tuned lr); the winner runs on the fresh seeds. Empty: `diloco.outer_lr`."""
    stats_every: int
    """Rounds between two measurements of captured energy and index overlap (0: never)."""

    def __post_init__(self) -> None:
        if self.sweep_seed in self.seeds:
            raise ValueError(f"seeds {self.seeds} must be fresh: the sweep used {self.sweep_seed}")
        all_peers = {self.sweep_peers, *self.peers}
        for c in self.candidates:
            all_peers.update(c.peers or ())
        for peers in sorted(all_peers):
            if self.sequences_per_step % peers:
                raise ValueError(
                    f"sequences_per_step {self.sequences_per_step} must split over {peers} peers"
                )
        names = [c.name for c in self.candidates]
        if len(set(names)) != len(names) or "adamw" in names:
            raise ValueError(f"candidate names must be unique and not 'adamw': {names}")
        if self.diloco_outer_lrs and self.diloco is None:
            raise ValueError("diloco_outer_lrs needs diloco")
        if self.diloco is not None and self.diloco.lr_of not in names:
            raise ValueError(f"diloco.lr_of {self.diloco.lr_of!r} is not a candidate")
        for inner in self._inner_steps():
            if self.steps % inner:
                raise ValueError(f"steps {self.steps} must be a multiple of inner_steps {inner}")

    def candidate_peers(self, candidate: Candidate) -> tuple[int, ...]:
        """The peer counts `candidate` runs at on the fresh seeds."""
        return candidate.peers if candidate.peers is not None else self.peers

    def _inner_steps(self) -> list[int]:
        inner = [
            c.settings.inner_steps
            for c in self.candidates
            if isinstance(c.settings, SparseLocoSettings)
        ]
        return inner + ([self.diloco.inner_steps] if self.diloco else [])

    @property
    def tokens_per_step(self) -> int:
        return self.sequences_per_step * self.seq_len


DISTRO_REFERENCE = DistroSettings(
    compression_decay=0.999,
    compression_topk=8,
    compression_chunk=64,
    quantize_1bit=True,
    clip_grad_norm=1.0,
)
"""Psyche's DisTrO settings (top-8 of each 64 x 64 tile, 1-bit values)."""

SPARSELOCO_H5 = SparseLocoSettings(
    inner_steps=5,
    outer_lr=1.0,
    compression_decay=0.9,
    compression_topk=32,
    compression_chunk=64,
    quantize_2bit=True,
)
"""The best SparseLoCo of the 300-step study (docs/distro.md)."""


def _variant(name: str, settings: CompressedSettings, lrs: tuple[float, ...]) -> Candidate:
    """A variant: swept like a base candidate, then on the fresh seeds at 4 peers only, with no
    synchronous twin (the base candidates measure what 16 peers and the delay cost)."""
    return Candidate(name, settings, lrs, peers=(4,), synchronous_diagnostic=False)


SPARSELOCO_LRS = (2e-3, 4e-3, 8e-3)
DISTRO_LRS = (1e-3, 2e-3, 4e-3)
TEMPLAR = dataclasses.replace(
    SPARSELOCO_H5, mean_over_choosers=True, clip_to_median=True, dct=False
)

VARIANT_CANDIDATES = (
    _variant("sparseloco-templar", TEMPLAR, SPARSELOCO_LRS),
    _variant(
        "sparseloco-outer0.5", dataclasses.replace(SPARSELOCO_H5, outer_lr=0.5), SPARSELOCO_LRS
    ),
    _variant("sparseloco-outer2", dataclasses.replace(SPARSELOCO_H5, outer_lr=2.0), SPARSELOCO_LRS),
    _variant(
        "sparseloco-k128", dataclasses.replace(SPARSELOCO_H5, compression_topk=128), SPARSELOCO_LRS
    ),
    _variant("distro-k32", dataclasses.replace(DISTRO_REFERENCE, compression_topk=32), DISTRO_LRS),
    _variant("distro-wd0.1", dataclasses.replace(DISTRO_REFERENCE, weight_decay=0.1), DISTRO_LRS),
    _variant("distro-wd1", dataclasses.replace(DISTRO_REFERENCE, weight_decay=1.0), DISTRO_LRS),
    _variant(
        "sparseloco-codebook",
        dataclasses.replace(SPARSELOCO_H5, quantize_codebook=True),
        SPARSELOCO_LRS,
    ),
    _variant(
        "sparseloco-templar-codebook",
        dataclasses.replace(TEMPLAR, quantize_codebook=True),
        (*SPARSELOCO_LRS, 1.6e-2),  # 8e-3 won the first three
    ),
    _variant(
        "sparseloco-4bit",
        dataclasses.replace(SPARSELOCO_H5, quantize_2bit=False, quantize_4bit=True),
        SPARSELOCO_LRS,
    ),
    _variant(
        "distro-aggmom0.9",
        dataclasses.replace(DISTRO_REFERENCE, aggregate_momentum=0.9),
        (2e-3, 4e-3, 8e-3, 1.6e-2),  # 8e-3 won the first three
    ),
    _variant(
        "distro-dense",
        dataclasses.replace(DISTRO_REFERENCE, compression_topk=64 * 64),
        (*DISTRO_LRS, 8e-3, 1.6e-2),  # 4e-3 won the first three, then 8e-3 the first four
    ),
)
"""Variants of issue 22's third item, added to `PROTOCOL` by `bench/distro.py --study
--variants`: SparseLoCo as Templar compresses, averages and bounds results (top-k of raw
values, no DCT; each coefficient over the peers that chose it; each result clipped to the
median RMS); SparseLoCo's outer learning rate at 0.5 and 2 (it is 1); the bytes spent at the
146x goal (SparseLoCo top-128, DisTrO top-32); DisTrO with weight decay 0.1 and 1; SparseLoCo's
values on the 2-bit codebook (alone and with Templar's settings) and in 4 bits; DisTrO with
momentum 0.9 on the applied sign aggregate (study-only: `DistroSettings.aggregate_momentum`,
swept an octave higher since the averaged signs move weights less than signs); and DisTrO
keeping every coefficient (`distro-dense`: the sign of the whole momentum, about as many
bytes as bf16), the ceiling of the sign update as DiLoCo is of the local steps. Each is
swept like its base candidate and runs on the fresh seeds at 4 peers (`_variant`): six or
seven runs of about a base candidate's cost each (`distro-dense`'s three times that)."""

PROTOCOL = StudyProtocol(
    model=ModelShape(hidden=64, layers=4, heads=4, intermediate=192),  # 246,336 parameters
    seq_len=128,
    sequences_per_step=16,  # 2,048 tokens per step
    steps=600,  # 1.23M tokens, 5 per parameter
    warmup_steps=30,
    final_fraction=0.1,
    eval_every=25,
    valid_windows=128,
    adamw_lrs=(2e-3, 4e-3, 8e-3),
    candidates=(
        Candidate("distro", DISTRO_REFERENCE, DISTRO_LRS),
        Candidate("sparseloco", SPARSELOCO_H5, SPARSELOCO_LRS),
    ),
    sweep_peers=4,
    peers=(4, 16),
    sweep_seed=0,
    seeds=(1, 2, 3),
    synchronous_diagnostic=True,
    diloco=DilocoSettings(inner_steps=5, outer_lr=0.7, outer_momentum=0.9, lr_of="sparseloco"),
    diloco_outer_lrs=(0.1, 0.3, 0.7),
    stats_every=25,
)

QUICK_PROTOCOL = StudyProtocol(
    model=ModelShape(hidden=16, layers=1, heads=2, intermediate=32),
    seq_len=16,
    sequences_per_step=4,
    steps=4,
    warmup_steps=1,
    final_fraction=0.1,
    eval_every=2,
    valid_windows=4,
    adamw_lrs=(1e-3, 4e-3),
    candidates=(
        Candidate("distro", DISTRO_REFERENCE, (2e-3, 4e-3)),
        Candidate("sparseloco", SparseLocoSettings(2, 1.0, 0.9, 32, 64), (2e-3,)),
        Candidate(
            "sparseloco-templar",
            SparseLocoSettings(
                2, 1.0, 0.9, 32, 64, mean_over_choosers=True, clip_to_median=True, dct=False
            ),
            (2e-3,),
        ),
        Candidate(
            "sparseloco-codebook",
            SparseLocoSettings(2, 1.0, 0.9, 32, 64, quantize_codebook=True),
            (2e-3,),
            peers=(4,),
            synchronous_diagnostic=False,
        ),
        Candidate(
            "distro-aggmom",
            dataclasses.replace(DISTRO_REFERENCE, aggregate_momentum=0.9),
            (4e-3,),
            peers=(4,),
            synchronous_diagnostic=False,
        ),
    ),
    sweep_peers=2,
    peers=(2, 4),
    sweep_seed=0,
    seeds=(1, 2),
    synchronous_diagnostic=True,
    diloco=DilocoSettings(inner_steps=2, outer_lr=0.7, outer_momentum=0.9, lr_of="sparseloco"),
    diloco_outer_lrs=(0.3, 0.7),
    stats_every=1,
)
