"""The DisTrO study: Psyche's settings against variants on the tiny model, every row measured.

Each variant runs through `simulation.run_distro` (4 peers, the real result codec and the
two-round pipeline) for `steps` steps of 8 x 256 bytes on every seed, next to AdamW
(`simulation.run_adamw`) on the same seed, batches and tokens. A row reports the final
validation loss over AdamW's per seed and the result bytes a peer sends per token it trained
(`bytes_per_token`: the encoded result, framing included, over the tokens of one round;
`payload_bytes_per_token` counts only index and value bytes).
`ratio_vs_bf16` compares that with a dense bf16 gradient per token. `best` is the variant with
the lowest mean `loss_vs_adamw` among those at least `MIN_RATIO_VS_BF16` times smaller
than bf16.

Runs can be cached in a JSON-lines file (one line per variant, seed and step count, keyed by
the variant's full settings), so that adding a variant does not re-run the others.

API: `Variant`, `VARIANTS`, `describe(variant)`, `run_study(steps, seeds, variants, *,
cache=None, progress=None) -> dict`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from psyche_client.distro import DistroSettings
from psyche_client.distro.sparseloco import SparseLocoSettings

from bench.study.simulation import (
    load_stdlib_corpus,
    prototype_llama_config,
    run_adamw,
    run_distro,
)

MIN_RATIO_VS_BF16 = 600.0
PEERS = 4
BATCH = 8
SEQ_LEN = 256


@dataclass(frozen=True)
class Variant:
    name: str
    settings: DistroSettings | SparseLocoSettings
    lr: float
    warmup: int = 20
    final_fraction: float = 0.1


REFERENCE = DistroSettings(
    compression_decay=0.999,
    compression_topk=8,
    compression_chunk=64,
    quantize_1bit=True,
    clip_grad_norm=1.0,
)


def _distro(**changes: Any) -> DistroSettings:
    return dataclasses.replace(REFERENCE, **changes)


def _sparseloco(**changes: Any) -> SparseLocoSettings:
    base = SparseLocoSettings(
        inner_steps=5,
        outer_lr=1.0,
        compression_decay=0.95,
        compression_topk=32,
        compression_chunk=64,
        quantize_2bit=True,
    )
    return dataclasses.replace(base, **changes)


VARIANTS: tuple[Variant, ...] = (
    Variant("reference", REFERENCE, 3e-3),
    Variant("sparseloco-H5-k32", _sparseloco(), 2e-3),
    Variant("sparseloco-H10-k64", _sparseloco(inner_steps=10, compression_topk=64), 2e-3),
    Variant("sparseloco-H5-k32-decay0.9", _sparseloco(compression_decay=0.9), 2e-3),
    Variant("sparseloco-H5-k32-decay0.8", _sparseloco(compression_decay=0.8), 2e-3),
    Variant("sparseloco-H5-k32-decay0.5", _sparseloco(compression_decay=0.5), 2e-3),
    # a ceiling, not a candidate: SparseLoCo without compression (every coefficient, bf16)
    Variant("sparseloco-H5-dense", _sparseloco(compression_topk=4096, quantize_2bit=False), 2e-3),
    Variant("topk4", _distro(compression_topk=4), 3e-3),
    Variant("topk16", _distro(compression_topk=16), 3e-3),
    Variant("topk32", _distro(compression_topk=32), 3e-3),
    Variant("2bit", _distro(quantize_1bit=False, quantize_2bit=True), 3e-3),
    Variant("decay0.99", _distro(compression_decay=0.99), 3e-3),
    Variant("decay0.9", _distro(compression_decay=0.9), 3e-3),
    Variant("lr5e-3", REFERENCE, 5e-3),
    Variant("lr3e-3-to-0", REFERENCE, 3e-3, final_fraction=0.0),
)


def describe(variant: Variant) -> dict[str, Any]:
    """The settings of a row, as JSON: optimizer kind, its fields, the lr schedule."""
    kind = "SparseLoCo" if isinstance(variant.settings, SparseLocoSettings) else "Distro"
    fields = dataclasses.asdict(variant.settings)
    if "betas" in fields:
        fields["betas"] = list(fields["betas"])
    return {
        "optimizer": kind,
        **fields,
        "lr_schedule": {
            "peak_lr": variant.lr,
            "warmup_steps": variant.warmup,
            "final_lr": variant.final_fraction * variant.lr,
            "shape": "linear warmup, cosine decay",
        },
    }


def _cache_key(what: str, settings: dict[str, Any], seed: int, steps: int) -> str:
    return json.dumps([what, settings, seed, steps], sort_keys=True)


def _load_cache(path: Path | None) -> dict[str, dict[str, Any]]:
    if path is None or not path.exists():
        return {}
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {entry["key"]: entry for entry in entries}


def _store(path: Path | None, entry: dict[str, Any]) -> None:
    if path is not None:
        with path.open("a") as out:
            out.write(json.dumps(entry) + "\n")


def run_study(
    steps: int,
    seeds: Sequence[int],
    variants: Sequence[Variant] = VARIANTS,
    *,
    cache: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure every variant on every seed against AdamW; returns the study object."""
    say = progress or (lambda _: None)
    cached = _load_cache(cache)
    corpus = load_stdlib_corpus()
    params = sum(p.numel() for p in _meta_model().parameters())
    dense_bf16_per_token = 2 * params / (BATCH // PEERS * SEQ_LEN)

    def measured(what: str, settings: dict[str, Any], seed: int, run: Callable) -> dict:
        key = _cache_key(what, settings, seed, steps)
        if key not in cached:
            say(f"{what}, seed {seed}, {steps} steps")
            cached[key] = {"key": key, **run()}
            _store(cache, cached[key])
        return cached[key]

    adamw = [
        measured(
            "adamw",
            {"lr": 1e-3},
            seed,
            lambda seed=seed: {"val": run_adamw(corpus, steps, lr=1e-3, seed=seed).final_val},
        )["val"]
        for seed in seeds
    ]
    rows = []
    for variant in variants:
        settings = describe(variant)
        runs = [
            measured(
                variant.name,
                settings,
                seed,
                lambda seed=seed, variant=variant: _run_variant(corpus, steps, variant, seed),
            )
            for seed in seeds
        ]
        bytes_per_token = runs[0]["result_bytes"] / runs[0]["tokens_per_round"]
        rows.append(
            {
                "name": variant.name,
                "settings": settings,
                "loss_vs_adamw": [run["val"] / base for run, base in zip(runs, adamw, strict=True)],
                "bytes_per_token": bytes_per_token,
                "payload_bytes_per_token": runs[0]["payload_bytes"] / runs[0]["tokens_per_round"],
                "ratio_vs_bf16": dense_bf16_per_token / bytes_per_token,
                "val_loss": [run["val"] for run in runs],
                "replicas_identical": all(run["identical"] for run in runs),
            }
        )
    eligible = [row for row in rows if row["ratio_vs_bf16"] >= MIN_RATIO_VS_BF16]
    best = min(eligible or rows, key=lambda row: sum(row["loss_vs_adamw"]))
    return {
        "study": rows,
        "best": best["name"],
        "best_rule": f"lowest mean loss_vs_adamw among rows with ratio_vs_bf16 >= {MIN_RATIO_VS_BF16:g}",
        "steps": steps,
        "seeds": list(seeds),
        "adamw_val_loss": adamw,
        "tokens": steps * BATCH * SEQ_LEN,
        "peers": PEERS,
    }


def _run_variant(corpus: Any, steps: int, variant: Variant, seed: int) -> dict[str, Any]:
    report = run_distro(
        corpus,
        steps,
        lr=variant.lr,
        peers=PEERS,
        batch=BATCH,
        seq_len=SEQ_LEN,
        seed=seed,
        settings=variant.settings,
        warmup=variant.warmup,
        final_fraction=variant.final_fraction,
    )
    return {
        "val": report.final_val,
        "identical": report.replicas_identical,
        "result_bytes": report.blob_bytes_per_peer,
        "payload_bytes": report.payload_bytes_per_peer,
        "tokens_per_round": report.tokens_per_peer_round,
        "seconds": report.seconds,
    }


def _meta_model() -> transformers.LlamaForCausalLM:
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(prototype_llama_config())
