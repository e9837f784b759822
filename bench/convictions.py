"""False-conviction rate of the verification rules: whole runs of the pure coordinator with
simulated verifiers (bench/study/verification_sim.py), one lying verifier that accuses every
result it checks, optionally a cheat whose every result fails the check, optionally honest
results that fail the check by bad luck (`unlucky`: each with probability 1 %, about the
measured rate of honest tiny-batch checks below the threshold, docs/verification.md); prints
one JSON object.

Per setting `members/percent liars+cheats[, unlucky]`: `runs` seeds of `--steps` steps each (epochs of
120 s of the fake clock, removed keys join again at the next epoch), and over them
`false_convictions` (honest trainers convicted: the rule's promise is 0), `honest_accusers_removed`
(honest verifiers removed as false accusers: 0), `liar_removals` (how often the liar was
removed as a refuted accuser) with `first_removal_steps` (the step of the first, per run),
`cheat_convictions` and `first_cheat_conviction_steps`, `liar_checks` (batches the liar
accused). Baseline, in the same runs: `old_rule_false_convictions`, the (step, honest trainer)
pairs the previous rule (a strict majority of a trainer's checkers in one round) would have
convicted on the liar's word alone. `unlucky_results` (honest results that failed by bad
luck, each accused by every verifier that sampled it) and `one_step_rule_false_convictions`:
the (epoch, honest trainer) pairs whose strikes named two verifiers, which the rule before the
step rule convicted even when all came from one step, and for cheats
`first_cheat_conviction_steps_one_step_rule`: the step at which that rule convicted the cheat
first, per run.

`--quick` (what `make test` runs): one seed of 40 steps per setting: the same code path in
seconds.

Usage: .venv/bin/python bench/convictions.py [--seeds 10] [--steps 200] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.study.verification_sim import measure  # noqa: E402

UNLUCKY = 0.01
"""Rate at which an honest result fails the check in the `unlucky` settings."""

SETTINGS = [  # members, percent, liars, cheats, honest results failing by bad luck
    (4, 25, 1, 0, False),
    (8, 25, 1, 0, False),
    (8, 50, 1, 0, False),
    (8, 25, 1, 1, False),
    (4, 25, 0, 1, False),
    (8, 25, 0, 0, False),
    (4, 50, 0, 1, False),
    (4, 50, 0, 0, True),
    (8, 25, 0, 0, True),
    (8, 50, 1, 1, True),
]


def row(
    members: int, percent: int, liars: int, cheats: int, unlucky: float, seeds: int, steps: int
) -> Any:
    started = time.perf_counter()
    runs = [measure(seed, members, percent, liars, cheats, steps, unlucky) for seed in range(seeds)]
    return {
        "runs": len(runs),
        "steps": sum(r.steps for r in runs),
        "false_convictions": sum(r.false_convictions for r in runs),
        "honest_accusers_removed": sum(r.honest_accusers_removed for r in runs),
        "liar_checks": sum(r.liar_checks for r in runs),
        "old_rule_false_convictions": sum(r.old_rule_false_convictions for r in runs),
        "unlucky_results": sum(r.unlucky_results for r in runs),
        "one_step_rule_false_convictions": sum(len(r.one_step_rule) for r in runs),
        "liar_removals": sum(len(r.liar_removals) for r in runs),
        "first_removal_steps": [r.liar_removals[0] if r.liar_removals else None for r in runs],
        "cheat_convictions": sum(len(r.cheat_convictions) for r in runs),
        "first_cheat_conviction_steps": [
            r.cheat_convictions[0] if r.cheat_convictions else None for r in runs
        ],
        "first_cheat_conviction_steps_one_step_rule": [
            min(r.cheat_one_step_rule.values(), default=None) for r in runs
        ],
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=None, help="seeds per setting (10)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (200)")
    parser.add_argument("--quick", action="store_true", help="1 seed of 40 steps (seconds)")
    args = parser.parse_args()
    seeds = args.seeds or (1 if args.quick else 10)
    steps = args.steps or (40 if args.quick else 200)
    table = {}
    for members, percent, liars, cheats, unlucky in SETTINGS:
        key = f"{members}/{percent}% {liars} liar(s) + {cheats} cheat(s)"
        key += f", unlucky {UNLUCKY:.0%}" if unlucky else ""
        rate = UNLUCKY if unlucky else 0.0
        table[key] = row(members, percent, liars, cheats, rate, seeds, steps)
        print(key, table[key], file=sys.stderr)
    report = {
        "benchmark": "convictions",
        "quick": args.quick,
        "seeds": seeds,
        "steps": steps,
        "settings": table,
        "false_convictions": sum(r["false_convictions"] for r in table.values()),
        "old_rule_false_convictions": sum(r["old_rule_false_convictions"] for r in table.values()),
        "one_step_rule_false_convictions": sum(
            r["one_step_rule_false_convictions"] for r in table.values()
        ),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
