"""False-conviction rate of the verification rules, against fixed and adaptive attackers:
whole runs of the pure coordinator with simulated verifiers (bench/study/verification_sim.py,
the real `accuse`/`attest`/judge code); prints one JSON object.

Attackers per setting (`members/percent` then who): a lying verifier that accuses every
result it checks (`liar`); a cheat whose every result fails the check (`cheat`); a selective
cheat that fails the check only in rounds it predicts no verifier samples its batches
(`selective`; `public sample` runs the rule before the hidden sample seed, when that
prediction was exact); two colluding verifiers that pass every result of a cheat
(`2 shielders`); a verifier that accuses exactly the batches no other verifier checks
(`sole liar`). `unlucky 1%`: each honest result also fails the check by bad luck with
probability 1 % (about the measured rate of honest tiny-batch checks below the threshold,
docs/verification.md), and is then accused by every verifier that samples it.

Per setting: `runs` seeds of `--steps` steps each (epochs of 120 s of the fake clock, removed
keys join again at the next epoch), and over them `false_convictions` (honest trainers
convicted: the rule's promise is 0; `false_convictions_by_lies`, those of them that a lying
verifier's accusation of a passing result carried, the rest resting on honest accusations of
a result that failed twice by bad luck), `honest_verifiers_removed` (honest verifiers removed as
false accusers or false passers: 0), `liar_removals` (lying verifiers removed, any kind) with
`first_removal_steps` (per run), `cheat_convictions` and `first_cheat_conviction_steps`,
`cheat_rounds` of `cheat_training_rounds` (rounds the cheats cheated, of those they trained)
and `cheated_unchecked` (cheated rounds no verifier sampled), `cheated_applied` (cheated
rounds whose results every client applied: neither refused nor after a conviction) and
`cheat_results_refused`, `honest_results_refused` (results refused on standing accusations
before any conviction: a cheat's, an honest trainer's), `liar_checks` (batches the liars
accused). Baselines, in the same runs: `old_rule_false_convictions` (the first rule: a
strict majority of a trainer's checkers in one round, on the liar's word alone),
`one_step_rule_false_convictions` ((epoch, honest trainer) pairs whose strikes named two
verifiers, even of one step) and `two_step_rule_false_convictions` (two verifiers and two
steps in all: the rule before each verifier needed two steps of its own).

`--quick` (what `make test` runs): one seed of 40 steps per setting: the same code path in
seconds.

Usage: .venv/bin/python bench/convictions.py [--seeds 10] [--steps 200] [--only TEXT] [--quick]
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

SETTINGS: list[tuple[str, int, int, dict[str, int], bool]] = [
    # name, members, percent, attackers (measure's keyword counts), honest bad luck
    ("1 liar", 4, 25, {"liars": 1}, False),
    ("1 liar", 8, 25, {"liars": 1}, False),
    ("1 liar", 8, 50, {"liars": 1}, False),
    ("1 liar + 1 cheat", 8, 25, {"liars": 1, "cheats": 1}, False),
    ("1 cheat", 4, 25, {"cheats": 1}, False),
    ("clean", 8, 25, {}, False),
    ("1 cheat", 4, 50, {"cheats": 1}, False),
    ("clean", 4, 50, {}, True),
    ("clean", 8, 25, {}, True),
    ("1 liar + 1 cheat", 8, 50, {"liars": 1, "cheats": 1}, True),
]
for _members, _percent in ((4, 25), (8, 25), (8, 50)):
    SETTINGS += [
        ("1 selective", _members, _percent, {"selective": 1}, False),
        ("1 selective, public sample", _members, _percent, {"selective": 1, "public": 1}, False),
        ("1 cheat + 2 shielders", _members, _percent, {"cheats": 1, "shielders": 2}, False),
        ("1 sole liar", _members, _percent, {"sole_liars": 1}, True),
        ("1 selective", _members, _percent, {"selective": 1}, True),
    ]


def row(
    members: int, percent: int, attackers: dict[str, int], unlucky: float, seeds: int, steps: int
) -> Any:
    started = time.perf_counter()
    counts = {k: v for k, v in attackers.items() if k != "public"}
    counts.setdefault("liars", 0)
    hidden = not attackers.get("public")
    runs = [
        measure(
            seed,
            members,
            percent,
            total_steps=steps,
            unlucky=unlucky,
            hidden_sample=hidden,
            **counts,
        )
        for seed in range(seeds)
    ]
    return {
        "runs": len(runs),
        "steps": sum(r.steps for r in runs),
        "false_convictions": sum(r.false_convictions for r in runs),
        "false_convictions_by_lies": sum(r.false_convictions_by_lies for r in runs),
        "honest_verifiers_removed": sum(r.honest_accusers_removed for r in runs),
        "liar_checks": sum(r.liar_checks for r in runs),
        "old_rule_false_convictions": sum(r.old_rule_false_convictions for r in runs),
        "unlucky_results": sum(r.unlucky_results for r in runs),
        "twice_unlucky": sum(r.twice_unlucky for r in runs),
        "one_step_rule_false_convictions": sum(len(r.one_step_rule) for r in runs),
        "two_step_rule_false_convictions": sum(len(r.two_step_rule) for r in runs),
        "liar_removals": sum(len(r.liar_removals) for r in runs),
        "first_removal_steps": [r.liar_removals[0] if r.liar_removals else None for r in runs],
        "cheat_convictions": sum(len(r.cheat_convictions) for r in runs),
        "first_cheat_conviction_steps": [
            r.cheat_convictions[0] if r.cheat_convictions else None for r in runs
        ],
        "cheat_training_rounds": sum(r.cheat_training_rounds for r in runs),
        "cheat_rounds": sum(r.cheat_rounds for r in runs),
        "cheated_unchecked": sum(r.cheated_unchecked for r in runs),
        "cheated_applied": sum(r.cheated_applied for r in runs),
        "cheat_results_refused": sum(r.cheat_results_refused for r in runs),
        "honest_results_refused": sum(r.honest_results_refused for r in runs),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=None, help="seeds per setting (10)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (200)")
    parser.add_argument("--quick", action="store_true", help="1 seed of 40 steps (seconds)")
    parser.add_argument(
        "--only",
        default="",
        help="run only the settings whose name (e.g. '8/50%% 1 sole liar') contains this text",
    )
    args = parser.parse_args()
    seeds = args.seeds or (1 if args.quick else 10)
    steps = args.steps or (40 if args.quick else 200)
    keys = [
        f"{m}/{pc}% {name}" + (f", unlucky {UNLUCKY:.0%}" if unlucky else "")
        for name, m, pc, _, unlucky in SETTINGS
    ]
    if not any(args.only in key for key in keys):
        parser.error(f"--only {args.only!r} matches no setting (e.g. {keys[0]!r})")
    table = {}
    for name, members, percent, attackers, unlucky in SETTINGS:
        key = f"{members}/{percent}% {name}"
        key += f", unlucky {UNLUCKY:.0%}" if unlucky else ""
        if args.only not in key:
            continue
        rate = UNLUCKY if unlucky else 0.0
        table[key] = row(members, percent, attackers, rate, seeds, steps)
        print(key, table[key], file=sys.stderr)
    report = {
        "benchmark": "convictions",
        "quick": args.quick,
        "seeds": seeds,
        "steps": steps,
        "settings": table,
        "false_convictions": sum(r["false_convictions"] for r in table.values()),
        "honest_verifiers_removed": sum(r["honest_verifiers_removed"] for r in table.values()),
        "old_rule_false_convictions": sum(r["old_rule_false_convictions"] for r in table.values()),
        "one_step_rule_false_convictions": sum(
            r["one_step_rule_false_convictions"] for r in table.values()
        ),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
