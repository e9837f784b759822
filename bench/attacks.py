"""Attack suite: every attack of tests/e2e against a clean run of the same settings; prints
one JSON object.

For each size `M/N` of `--sizes` (default 1/4 and 2/8: M of N clients malicious) and each
attack of `--only` (default all of `bench.harness.attack_catalog.ATTACKS`), one run of real processes
(`psyche-server` and `psyche-client`s on loopback, `builtin:llama-tiny` on CPU, `--steps`
steps (default 30), global batch max(6, N) × 32 tokens, every member a witness, max round time 10 s) with N − M honest clients and M
attackers, and one clean run of N honest clients per distinct setting of the selected
attacks at that size (1-bit values with 25% verifiers; bf16 values without verifiers for the
huge-values trainer; samples from the server's data server for the data squatter). Floods
(idle sockets, decode bombs, relay exhaustion, data-server squatting) are hosts, and
intruders are clients a permissioned run refuses (an unlisted key, an expired or forged
delegation), not members: their runs have N − M member clients. The delegated sybils are
N − M + 1 delegates of each of M listed keys, of which the server seats one per key (run with
`--max-delegates-per-authorizer 1`): N members. `tamper` is a man in the
middle, not a member: its runs have N honest clients, M of which reach the server through a
proxy that flips one byte of their link after the handshake.

Per attack (key `"NAME M/N"`):

- `loss_vs_clean`: held-out loss of the first honest client's final checkpoint divided by the
  clean run's (the same 64 × 32 tokens of the corpus's last 5%; `attack_run.eval_loss`);
  `gain_vs_clean`: the loss drop from the untrained model (`untrained_loss`, the same seed)
  that the attacked run achieved, as a fraction of the clean run's drop (a short run moves
  the loss little, so this is the more sensitive of the two);
- `honest_hashes_agree`: the honest clients' weights hashes are identical at every step they
  all applied (`common_steps` of them), and `honest_exit_ok` whether they all exited 0;
- `attacker_removed`: every attacker was convicted by the verifiers or dropped by a health
  check (as the coordinator recorded it); for the floods, every flooding host was shed by its
  target (idle sockets: some closed by caps at accept, handshake or pre-join timeouts; decode
  bombs: every one refused and its socket closed; relay exhaustion: no dial granted); for the
  intruders, each was refused at its Join and exited 1; for `tamper`, every altered frame
  failed authentication at the side that read it; for the sybils, each one past its owner's
  cap was refused at its Join (the seated ones are manifest liars, which stay); for the data
  squatter, the data server closed every connection it opened; for the relay hog, no burst
  got more of the victim's pipes than one key's share (8); for the equivocation replayer, it
  sent its proofs and nobody was convicted on them (`details` counts the proofs the server
  refused). False is an observation, not a failure:
  docs/security.md says which attackers the protocol cannot remove and bounds their harm;
- `steps_to_removal`: per attacker, the step of its conviction or drop (None: not removed);
  `honest_convicted`: honest clients convicted in the attacked run, `honest_dropped`: honest
  clients dropped (by a health check, or for false reports).

Per clean run (key `"clean M/N ..."`): `loss_drop`, the untrained loss minus the run's (the
default 30 steps at the e2e settings, constant LR 3e-3, are meant to move it by more than
1.0), and `false_convictions`, honest clients the coordinator convicted; their sum over every
clean run is the top-level `false_convictions`.

The runs are sequential; each is seconds of real training and the protocol's timeouts, so
the whole table takes a long time (several minutes per row on a loaded 2-core machine). The
machine's core count and load averages before and after are reported: every process is
single-threaded, and a loaded machine slows rounds (not the comparison, which is per run).
`--quick`: one attack (`signflip`) at size 1/3, 4 steps (one of them applied): one
clean run and one attacked run, the whole path from the processes to the table. Still minutes
on a loaded 2-core machine (every run is a server and 3 client processes), so its test is
`slow` (`make test-all`).

Usage: .venv/bin/python bench/attacks.py [--steps 30] [--only signflip,huge] [--sizes 1/4]
[--keep DIR] [--quick]; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.attack_catalog import ATTACKS, Attack  # noqa: E402
from bench.harness.attack_run import (  # noqa: E402
    RunOutcome,
    run_attack,
    untrained_loss,
)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """`"M/N,..."` -> [(M, N), ...], each with 0 < M < N / 2 (fewer than half malicious)."""
    sizes = []
    for part in (p for p in text.split(",") if p):
        try:
            malicious, clients = (int(number) for number in part.split("/"))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"size {part!r} is not M/N") from exc
        if malicious <= 0 or 2 * malicious >= clients:
            raise argparse.ArgumentTypeError(f"size {part!r}: need 0 < M < N/2")
        sizes.append((malicious, clients))
    return sizes


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def removal(run: RunOutcome) -> dict[str, Any]:
    """`steps_to_removal`: per attacker, the step it was convicted or dropped at (None: never);
    `honest_convicted`: honest clients the coordinator convicted in this run."""
    return {
        "steps_to_removal": run.removal_steps,
        "honest_convicted": len(run.honest_convicted),
        "honest_dropped": run.honest_dropped,
    }


def summary(run: RunOutcome) -> dict[str, Any]:
    return {
        "eval_loss": None if run.eval_loss is None else round(run.eval_loss, 4),
        "honest_exit_ok": run.honest_ok,
        "honest_hashes_agree": run.hashes_agree,
        "common_steps": len(run.common_steps),
        "losses_finite": run.losses_finite,
        "seconds": round(run.seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (30)")
    parser.add_argument(
        "--only",
        default=None,
        help=f"comma-separated attacks (default all: {','.join(ATTACKS)})",
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=None,
        help="comma-separated M/N: M of N clients malicious (default 1/4,2/8)",
    )
    parser.add_argument("--keep", type=Path, help="keep every run's logs under this directory")
    parser.add_argument("--quick", action="store_true", help="signflip at 1/3, 4 steps")
    args = parser.parse_args()
    quick = args.quick
    only = args.only or ("signflip" if quick else ",".join(ATTACKS))
    args.steps = args.steps or (4 if quick else 30)
    names = [name for name in only.split(",") if name]
    unknown = [name for name in names if name not in ATTACKS]
    if unknown:
        parser.error(f"unknown attacks {unknown}; known: {', '.join(ATTACKS)}")
    sizes: list[tuple[int, int]] = args.sizes or parse_sizes("1/3" if quick else "1/4,2/8")
    attacks: list[Attack] = [ATTACKS[name] for name in names]
    work = args.keep or Path(tempfile.mkdtemp(prefix="psyche-attacks-"))
    load_before = os.getloadavg()
    started = time.monotonic()
    table: dict[str, dict[str, Any]] = {}
    clean_table: dict[str, dict[str, Any]] = {}
    cache = Path(os.environ.get("PSYCHE_CACHE_DIR", work / "cache"))
    try:
        untrained = untrained_loss(cache)
        progress(f"untrained held-out loss {untrained:.4f}")
        for malicious, clients in sizes:
            size = f"{malicious}/{clients}"
            clean: dict[tuple[bool, int, bool], RunOutcome] = {}
            for setting in sorted({a.setting for a in attacks}):
                label = f"clean {size} {'1bit' if setting[0] else 'bf16'} verify{setting[1]}%"
                label += " data-server" if setting[2] else ""
                progress(f"{label}: {clients} honest clients, {args.steps} steps")
                run = run_attack(
                    work / label.replace(" ", "_").replace("/", "of").replace("%", ""),
                    None,
                    clients=clients,
                    steps=args.steps,
                    quantize_1bit=setting[0],
                    verification_percent=setting[1],
                    data_server=setting[2],
                    timeout=600,
                )
                clean[setting] = run
                clean_table[label] = {
                    "false_convictions": len(run.honest_convicted),
                    "honest_dropped": run.honest_dropped,
                    "loss_drop": None
                    if run.eval_loss is None
                    else round(untrained - run.eval_loss, 4),
                    **summary(run),
                }
                progress(f"{label}: {clean_table[label]}")
            for attack in attacks:
                name = f"{attack.name} {size}"
                progress(f"{name}: {attack.description}")
                run = run_attack(
                    work / f"{attack.name}_{malicious}of{clients}",
                    attack,
                    clients=clients,
                    malicious=malicious,
                    steps=args.steps,
                    timeout=600,
                )
                reference = clean[attack.setting]
                ratio = (
                    None
                    if run.eval_loss is None or reference.eval_loss is None
                    else round(run.eval_loss / reference.eval_loss, 4)
                )
                gain = (
                    None  # also when the clean run did not move the loss (too few steps)
                    if run.eval_loss is None
                    or reference.eval_loss is None
                    or reference.eval_loss == untrained
                    else round((untrained - run.eval_loss) / (untrained - reference.eval_loss), 4)
                )
                table[name] = {
                    "malicious": size,
                    "loss_vs_clean": ratio,
                    "gain_vs_clean": gain,
                    "honest_hashes_agree": run.hashes_agree,
                    "attacker_removed": bool(run.attackers_removed) and all(run.attackers_removed),
                    **removal(run),
                    **({"details": run.details} if run.details else {}),
                    "description": attack.description,
                    **summary(run),
                }
                progress(f"{name}: {table[name]}")
        report = {
            "benchmark": "attacks",
            "quick": quick,
            "attacks": table,
            "clean": clean_table,
            "false_convictions": sum(row["false_convictions"] for row in clean_table.values()),
            "model": "builtin:llama-tiny",
            "steps": args.steps,
            "loss": "held-out cross-entropy of the final checkpoint, 64 x 32 tokens",
            "untrained_loss": round(untrained, 4),
            "cpu_count": os.cpu_count(),
            "load_average_before_after": [
                round(load_before[0], 2),
                round(os.getloadavg()[0], 2),
            ],
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
