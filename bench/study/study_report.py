"""The optimizer study's JSON as the Markdown tables of docs/distro.md (a pure function).

`markdown(report)` takes the object `bench/distro.py --study` prints and returns three tables:
the learning-rate sweep (each candidate's final validation loss at each swept lr, the one
picked and whether it lies at an end of the range), the frontier (every setting measured on
the fresh seeds: bytes ratio, mean loss ratio with the per-seed ones, the worst seed above
the mean, tokens to target) and the goals. `python -m bench.study.study_report FILE` prints
it for a saved study, so the docs' tables are the measured JSON and nothing else.

API: `markdown(report) -> str`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def markdown(report: Mapping[str, Any]) -> str:
    """The sweep, frontier and goals tables of `report` (module doc)."""
    return "\n\n".join(
        (_sweep_table(report["sweep"]), _frontier_table(report["frontier"]), _goals(report))
    )


def _number(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _sweep_table(sweep: Mapping[str, Mapping[str, Any]]) -> str:
    lrs = sorted({float(lr) for entry in sweep.values() for lr in entry["losses"]})
    header = "| candidate | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | picked |"
    lines = [header, "|---" * (len(lrs) + 2) + "|"]
    for name, entry in sweep.items():
        losses = {float(lr): loss for lr, loss in entry["losses"].items()}
        picked = float(entry["outer_lr"] if name == "diloco" else entry["lr"])
        cells = []
        for lr in lrs:
            loss = losses.get(lr)
            text = _number(loss, 4)
            cells.append(f"**{text}**" if loss is not None and lr == picked else text)
        edge = ", at the edge" if entry["at_edge"] else ""
        label = "diloco (outer lr)" if name == "diloco" else name
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {picked:g}{edge} |")
    return "\n".join(lines)


def _frontier_table(entries: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| setting | bytes ratio | loss ÷ AdamW, mean (seeds) | worst seed above mean "
        "| tokens to target |",
        "|---|---|---|---|---|",
    ]
    ordered = sorted(entries, key=lambda e: (e["diagnostic"], e["loss_vs_adamw_mean"]))
    for e in ordered:
        seeds = ", ".join(_number(s) for s in e["seeds"])
        name = f"diagnostic: {e['name']}" if e["diagnostic"] else e["name"]
        lines.append(
            f"| {name} | {e['bytes_ratio']:.0f} | {_number(e['loss_vs_adamw_mean'])} ({seeds}) "
            f"| {_number(e['seed_max_above_mean'])} | {_number(e['tokens_to_target_ratio'], 2)} |"
        )
    return "\n".join(lines)


def _goals(report: Mapping[str, Any]) -> str:
    lines = []
    for goal in report["goals"]:
        verdict = "met" if goal["met"] else "not met"
        lines.append(
            f"- At ≥ {goal['min_bytes_ratio']:g}× fewer bytes than bf16, a mean ≤ "
            f"{goal['max_loss_vs_adamw']:g}× AdamW's loss: best `{goal['best']}`, {verdict}."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.study.study_report STUDY.json")
    print(markdown(json.loads(Path(sys.argv[1]).read_text())))
