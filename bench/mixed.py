"""Mixed hardware: four dummy clients of speeds 1 : 1 : 2 : 4 with per-client shares against
the same run with equal shares; prints one JSON object.

Each run is real processes on loopback (`psyche-server` and four `psyche-client`s with the
dummy backend, `--dummy-training-delay-secs 0` and `--dummy-seconds-per-sample` of
`--unit` × 4, 4, 2, 1: a batch of n samples sleeps n times that), every member a witness, a
global batch of `--batch` samples, `--steps` steps, RoundWitness 0.5 s. The run with shares
sets `[config] per_client_shares = true` (`max_share_multiple = 4`); the other leaves it out
(equal shares, as the reference).

- `shares_over_equal`: applied samples per second with shares ÷ with equal shares. Samples
  per second are client 0's: over the second half of its `applied step` lines (shares have
  converged by then), the global batch times the fraction of the step's results applied,
  over the time between the first and last of those lines. Goal: ≥ 1.5.
- `dropped`: clients the coordinator dropped (health checks in the server's log), all three runs.
- `hashes_agree`: in each run, every client's weights hash is the same at every step they
  all applied.
- `last_trained_samples`: per run, the samples each client trained at its last trained step
  (with shares they approach 1 : 1 : 2 : 4 of the batch; a fixed per-round overhead keeps
  them a little closer to equal).

- `join_to_first_applied_rounds`, `join_to_first_applied_seconds`: a third run with
  `join_mid_epoch` (and shares): three members at `--unit` / 4 s per sample, `--join-steps`
  steps; the steps from the coordinator step at which a fourth client connected mid-epoch (its first
  state) to the first apply that took a result of it, and the seconds from starting its
  process to that apply (`bench.harness.join_run`). Goal: ≤ 5 rounds. `join` also says whether
  every client, the joiner too, had the same weights hash at every step they all applied.

`--quick`: 10 steps at unit 0.025 s (about a minute on a loaded 2-core machine; its figures
are small and noisy). Usage: .venv/bin/python bench/mixed.py [--steps 24] [--batch 32]
[--unit 0.05] [--join-steps 30] [--quick]; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.join_run import run_join  # noqa: E402
from bench.harness.mixed_run import MixedOutcome, run_mixed  # noqa: E402

SPEEDS = (1, 1, 2, 4)


def summary(outcome: MixedOutcome) -> dict[str, Any]:
    return {
        "samples_per_second": round(outcome.samples_per_second, 2),
        "hashes_agree": outcome.hashes_agree,
        "common_steps": outcome.common_steps,
        "dropped": outcome.dropped,
        "exit_codes": outcome.exit_codes,
        "last_trained_samples": [
            trained[max(trained)] if trained else 0 for trained in outcome.trained
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--unit", type=float, default=0.05, help="seconds per sample at speed 4")
    parser.add_argument(
        "--join-steps", type=int, default=30, help="steps of the run with a mid-epoch joiner"
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.unit, args.join_steps = 10, 0.025, 24
    costs = [args.unit * max(SPEEDS) / speed for speed in SPEEDS]
    runs: dict[str, MixedOutcome] = {}
    with tempfile.TemporaryDirectory(prefix="psyche-mixed-") as tmp:
        for name, shares in (("shares", True), ("equal", False)):
            started = time.monotonic()
            print(f"run: {name} shares ...", file=sys.stderr)
            runs[name] = run_mixed(
                Path(tmp) / name, costs, steps=args.steps, batch=args.batch, shares=shares
            )
            print(f"  {time.monotonic() - started:.0f} s", file=sys.stderr)
        started = time.monotonic()
        print("run: a mid-epoch joiner ...", file=sys.stderr)
        join = run_join(
            Path(tmp) / "join",
            steps=args.join_steps,
            join_after_step=2,
            batch=args.batch,
            seconds_per_sample=args.unit / 4,
        )
        print(f"  {time.monotonic() - started:.0f} s", file=sys.stderr)
    equal = runs["equal"].samples_per_second
    print(
        json.dumps(
            {
                "benchmark": "mixed",
                "quick": args.quick,
                "settings": {
                    "speeds": list(SPEEDS),
                    "seconds_per_sample": costs,
                    "steps": args.steps,
                    "batch": args.batch,
                    "cpus": os.cpu_count(),
                },
                "shares_over_equal": (
                    round(runs["shares"].samples_per_second / equal, 3) if equal else None
                ),
                "dropped": sum(run.dropped for run in runs.values()) + join.dropped,
                "hashes_agree": all(run.hashes_agree for run in runs.values())
                and join.hashes_agree,
                "join_to_first_applied_rounds": join.join_to_first_applied_rounds,
                "join_to_first_applied_seconds": join.join_to_first_applied_seconds,
                "join": {
                    "join_step": join.join_step,
                    "first_applied_step": join.first_applied_step,
                    "hashes_agree": join.hashes_agree,
                    "joiner_steps": join.joiner_steps,
                    "dropped": join.dropped,
                    "exit_codes": join.exit_codes,
                },
                "runs": {name: summary(run) for name, run in runs.items()},
                "load_average": list(os.getloadavg()),
            }
        )
    )


if __name__ == "__main__":
    main()
