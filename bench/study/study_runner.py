"""The optimizer study end to end: its runs (cached, in parallel) and the JSON it prints.

`run_protocol(protocol, *, jobs=1, cache=None, progress=None)` runs the stages of
`study_protocol` (sweep, winners on fresh seeds, diagnostics), each run through
`study_runs.run_one`, and returns the study object of issue 22:

    {"protocol": {...}, "sweep": {NAME: {"lr", "at_edge", "losses": {lr: loss}}},
     "study": [rows], "frontier": [entries], "best_at_146": NAME, "best_at_600": NAME,
     "goals": [...], "run_cpu_seconds": S}

(`run_cpu_seconds`: the CPU time of all its runs as measured when each ran, cached or not:
the study's cost on a free machine is about that over the cores it gets.)

(rows, entries and goals: `study_frontier`). `jobs` runs that many runs at once, each in its
own process with one torch thread. `cache` is a JSON-lines file of finished runs keyed by
everything that decides a run (protocol shape, settings, lr, seed, peers, mode), so an
interrupted or extended study redoes nothing it has.

API: `run_protocol`, `describe_protocol`.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from psyche_client.distro.sparseloco import SparseLocoSettings

from bench.study.simulation import load_stdlib_corpus
from bench.study.study_frontier import (
    Measurement,
    StudyRow,
    best_at,
    frontier,
    goals,
    pick_lr,
    study_row,
)
from bench.study.study_protocol import Candidate, DilocoSettings, StudyProtocol
from bench.study.study_runs import RunOutcome, RunSpec, run_one, run_one_mapped, save_corpus

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Planned:
    """A run of the study and how its row is labelled."""

    name: str
    family: str
    stage: str
    spec: RunSpec


def describe_protocol(protocol: StudyProtocol) -> dict[str, Any]:
    """The protocol as JSON, with the figures derived from it."""
    config = protocol.model.llama_config()
    params = _parameters(protocol)
    return {
        **dataclasses.asdict(protocol),
        "parameters": params,
        "tokens_per_step": protocol.tokens_per_step,
        "tokens": protocol.steps * protocol.tokens_per_step,
        "tokens_per_parameter": protocol.steps * protocol.tokens_per_step / params,
        "vocab_size": config.vocab_size,
    }


def _parameters(protocol: StudyProtocol) -> int:
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(protocol.model.llama_config())
    return sum(p.numel() for p in model.parameters())


def _key(spec: RunSpec) -> str:
    p = spec.protocol
    shape = {
        "model": dataclasses.asdict(p.model),
        "seq_len": p.seq_len,
        "sequences_per_step": p.sequences_per_step,
        "steps": p.steps,
        "warmup_steps": p.warmup_steps,
        "final_fraction": p.final_fraction,
        "eval_every": p.eval_every,
        "valid_windows": p.valid_windows,
        "stats_every": p.stats_every,
    }
    settings = None if spec.settings is None else _non_default_fields(spec.settings)
    kind = None if spec.settings is None else type(spec.settings).__name__
    diloco = None if spec.diloco is None else dataclasses.asdict(spec.diloco)
    return json.dumps(
        [shape, kind, settings, diloco, spec.lr, spec.seed, spec.peers, spec.synchronous],
        sort_keys=True,
    )


def _non_default_fields(settings: object) -> dict[str, Any]:
    """The settings' fields that differ from their defaults (so that a setting added later,
    left at its default, keeps the cache keys of the runs made before it existed)."""
    assert dataclasses.is_dataclass(settings) and not isinstance(settings, type)
    values = dataclasses.asdict(settings)
    return {
        f.name: values[f.name]
        for f in dataclasses.fields(settings)
        if f.default is dataclasses.MISSING or values[f.name] != f.default
    }


def _outcome_from(entry: dict[str, Any]) -> RunOutcome:
    fields = {f.name for f in dataclasses.fields(RunOutcome)}
    values = {k: v for k, v in entry.items() if k in fields}
    values["curve"] = [(int(t), float(loss)) for t, loss in values.get("curve", [])]
    return RunOutcome(**values)


class RunCache:
    """Finished runs by key, kept in a JSON-lines file when one is given."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.done: dict[str, RunOutcome] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    entry = json.loads(line)
                    self.done[entry["key"]] = _outcome_from(entry)

    def store(self, key: str, outcome: RunOutcome) -> None:
        self.done[key] = outcome
        if self.path is not None:
            with self.path.open("a") as out:
                out.write(json.dumps({"key": key, **dataclasses.asdict(outcome)}) + "\n")


def _cost(planned: Planned) -> float:
    """A rough relative cost, to start the longest runs first."""
    spec = planned.spec
    per_step = {"adamw": 1.0, "distro": 1.5, "sparseloco": 1.0, "diloco": 1.0}[planned.family]
    return per_step * (1 + spec.peers / 4)


def _execute(runs: Sequence[Planned], cache: RunCache, jobs: int, say: Progress) -> None:
    """Run every planned run that `cache` lacks and store it there."""
    todo: dict[str, Planned] = {}
    for planned in runs:
        key = _key(planned.spec)
        if key not in cache.done:
            todo.setdefault(key, planned)
    ordered = sorted(todo.items(), key=lambda item: -_cost(item[1]))
    say(f"{len(ordered)} runs to do ({len(runs) - len(ordered)} cached or repeated)")

    def finished(key: str, planned: Planned, outcome: RunOutcome) -> None:
        cache.store(key, outcome)
        say(
            f"{planned.stage} {planned.name} lr {planned.spec.lr:g} seed {planned.spec.seed}: "
            f"val {outcome.final_val:.4f} in {outcome.seconds:.0f} s"
        )

    if not ordered:
        return
    corpus = load_stdlib_corpus()
    if jobs <= 1:
        for key, planned in ordered:
            finished(key, planned, run_one(planned.spec, corpus))
        return
    with (
        tempfile.TemporaryDirectory(prefix="study-corpus-") as folder,
        ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool,
    ):
        train, valid = save_corpus(corpus, Path(folder))
        futures = [
            (key, planned, pool.submit(run_one_mapped, planned.spec, train, valid))
            for key, planned in ordered
        ]
        for key, planned, future in futures:
            finished(key, planned, future.result())


def _family(candidate: Candidate) -> str:
    return "sparseloco" if isinstance(candidate.settings, SparseLocoSettings) else "distro"


def _sweep_plan(protocol: StudyProtocol) -> list[Planned]:
    seed = protocol.sweep_seed
    runs = [
        Planned("adamw", "adamw", "sweep", RunSpec(protocol, lr, seed)) for lr in protocol.adamw_lrs
    ]
    for c in protocol.candidates:
        name = f"{c.name}-p{protocol.sweep_peers}"
        runs += [
            Planned(
                name,
                _family(c),
                "sweep",
                RunSpec(protocol, lr, seed, protocol.sweep_peers, c.settings),
            )
            for lr in c.lrs
        ]
    return runs


def _diloco_sweep_plan(protocol: StudyProtocol, winners: dict[str, float]) -> list[Planned]:
    """DiLoCo at each of `diloco_outer_lrs` on the sweep seed (none when not swept)."""
    if protocol.diloco is None:
        return []
    lr = winners[protocol.diloco.lr_of]
    return [
        Planned(
            f"diloco-p{protocol.sweep_peers}-outer{outer_lr:g}",
            "diloco",
            "diloco-sweep",
            RunSpec(
                protocol,
                lr,
                protocol.sweep_seed,
                protocol.sweep_peers,
                diloco=dataclasses.replace(protocol.diloco, outer_lr=outer_lr),
            ),
        )
        for outer_lr in protocol.diloco_outer_lrs
    ]


def _seeds_plan(
    protocol: StudyProtocol, winners: dict[str, float], diloco: DilocoSettings | None
) -> list[Planned]:
    runs = [
        Planned("adamw", "adamw", "seeds", RunSpec(protocol, winners["adamw"], seed))
        for seed in protocol.seeds
    ]
    for seed in protocol.seeds:
        for c in protocol.candidates:
            lr = winners[c.name]
            for peers in protocol.candidate_peers(c):
                spec = RunSpec(protocol, lr, seed, peers, c.settings)
                runs.append(Planned(f"{c.name}-p{peers}", _family(c), "seeds", spec))
            if protocol.synchronous_diagnostic and c.synchronous_diagnostic:
                peers = protocol.sweep_peers
                spec = RunSpec(protocol, lr, seed, peers, c.settings, synchronous=True)
                runs.append(Planned(f"{c.name}-p{peers}-sync", _family(c), "synchronous", spec))
        if diloco is not None:
            lr = winners[diloco.lr_of]
            for peers in protocol.peers:
                spec = RunSpec(protocol, lr, seed, peers, diloco=diloco)
                runs.append(Planned(f"diloco-p{peers}", "diloco", "diloco", spec))
    return runs


def _measurement(planned: Planned, outcome: RunOutcome) -> Measurement:
    spec = planned.spec
    return Measurement(
        name=planned.name,
        family=planned.family,
        stage=planned.stage,
        peers=spec.peers,
        lr=spec.lr,
        seed=spec.seed,
        synchronous=spec.synchronous or spec.diloco is not None,
        val_loss=outcome.final_val,
        tokens=outcome.tokens,
        payload_bytes_per_round=outcome.payload_bytes_per_round,
        framing_bytes_per_round=outcome.framing_bytes_per_round,
        tokens_per_peer_round=outcome.tokens_per_peer_round,
        peer_tokens_per_step=spec.protocol.tokens_per_step // spec.peers,
        replicas_identical=outcome.replicas_identical,
        captured_energy=outcome.captured_energy,
        index_overlap=outcome.index_overlap,
        seconds=outcome.seconds,
        cpu_seconds=outcome.cpu_seconds,
    )


def run_protocol(
    protocol: StudyProtocol,
    *,
    jobs: int = 1,
    cache: Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the whole study (module doc); returns the study object."""
    say = progress or (lambda _: None)
    done = RunCache(cache)
    sweep = _sweep_plan(protocol)
    _execute(sweep, done, jobs, say)
    losses: dict[str, dict[float, float]] = {}
    for planned in sweep:
        losses.setdefault(planned.name, {})[planned.spec.lr] = done.done[
            _key(planned.spec)
        ].final_val
    sweep_report: dict[str, Any] = {}
    winners: dict[str, float] = {}
    for label, candidate in [("adamw", "adamw")] + [
        (f"{c.name}-p{protocol.sweep_peers}", c.name) for c in protocol.candidates
    ]:
        lr, at_edge = pick_lr(losses[label])
        winners[candidate] = lr
        sweep_report[candidate] = {
            "lr": lr,
            "at_edge": at_edge,
            "losses": {f"{k:g}": v for k, v in losses[label].items()},
        }
    diloco_sweep = _diloco_sweep_plan(protocol, winners)
    _execute(diloco_sweep, done, jobs, say)
    diloco = protocol.diloco
    if diloco is not None and diloco_sweep:
        outer = {
            outer_lr: done.done[_key(planned.spec)].final_val
            for outer_lr, planned in zip(protocol.diloco_outer_lrs, diloco_sweep, strict=True)
        }
        outer_lr, at_edge = pick_lr(outer)
        diloco = dataclasses.replace(diloco, outer_lr=outer_lr)
        sweep_report["diloco"] = {
            "outer_lr": outer_lr,
            "at_edge": at_edge,
            "losses": {f"{k:g}": v for k, v in outer.items()},
        }
    seeds = _seeds_plan(protocol, winners, diloco)
    _execute(seeds, done, jobs, say)
    params = _parameters(protocol)
    tuned = {
        p.spec.seed: done.done[_key(p.spec)]
        for p in sweep + seeds
        if p.family == "adamw" and p.spec.lr == winners["adamw"]
    }
    rows: list[StudyRow] = []
    for planned in sweep + diloco_sweep + seeds:
        outcome = done.done[_key(planned.spec)]
        adamw = tuned[planned.spec.seed]
        rows.append(study_row(_measurement(planned, outcome), adamw.final_val, adamw.curve, params))
    entries = frontier(rows)
    return {
        "protocol": describe_protocol(protocol),
        "sweep": sweep_report,
        "study": [dataclasses.asdict(row) for row in rows],
        "frontier": [dataclasses.asdict(entry) for entry in entries],
        "best_at_146": best_at(entries, 146.0),
        "best_at_600": best_at(entries, 600.0),
        "goals": [dataclasses.asdict(goal) for goal in goals(entries)],
        "run_cpu_seconds": sum(row.cpu_seconds for row in rows),
    }
