"""Training speed with every client behind NAT (through the server's relay) vs every client public.

Builds the network lab of bench/harness/netlab (root, `ip`, `iptables`): a server host and `--clients`
client hosts, first all public, then each behind its own NAT router that allows outbound
connections only, so every P2P byte between clients crosses the relay. Both runs use the same
state (dummy training, `--step-delay` s per batch, `--steps` steps) and the same processes;
the order alternates over `--repeats`. For each run it measures, from the clients' JSON logs,
applied steps per minute (first to last applied step of each client, the median over clients)
and, from the server's log at shutdown, the bytes the relay forwarded per applied step.

Prints one JSON object: per setup the steps/min of every repeat and their median,
`natted_over_public` (ratio of the medians), relayed bytes per step, and the load average
before and after (the machine is shared: compare the ratio, not absolute figures).
`--quick` (what `make test` runs where a lab can be built): both setups with 2 clients, 5 steps
of 0.05 s dummy batches: the smallest lab run that still applies steps through the relay.

Usage (as root): .venv/bin/python bench/netlab.py [--clients 4] [--steps 24] [--repeats 1]
[--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.client_run import Proc, wait_for, write_state  # noqa: E402
from bench.harness.netlab.cluster import LabCluster  # noqa: E402
from bench.harness.netlab.lab import Lab  # noqa: E402


def run_once(setup: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One run of `setup` ("public" or "natted"); its steps/min and relayed bytes per step."""
    state = write_state(
        tmp / "state.toml",
        total_steps=args.steps,
        warmup_time=20,
        init_min_clients=args.clients,
        min_clients=max(2, args.clients - 1),
        witness_nodes=2,
        batch=2 * args.clients,
        epoch_time=3600,
    )
    with Lab() as lab:
        lab.add_host("srv")
        names = [f"c{i + 1}" for i in range(args.clients)]
        for name in names:
            if setup == "natted":
                lab.add_natted_host(name)
            else:
                lab.add_host(name)
        cluster = LabCluster(lab, tmp, state)
        server = cluster.start_server("srv")
        clients = [cluster.start_client(n, dummy_delay=args.step_delay) for n in names]
        wait_for(
            lambda: all(p.popen.poll() is not None for p in clients),
            args.timeout,
            f"the {setup} run to finish",
            cluster.diagnostics,
        )
        failed = [p.name for p in clients if p.popen.returncode != 0]
        if failed:
            raise SystemExit(f"{setup}: clients {failed} failed\n{cluster.diagnostics()}")
        server.popen.send_signal(signal.SIGTERM)
        server.popen.wait(30)
        rates = [steps_per_minute(p) for p in clients]
        steps = max(len(p.events("applied step")) for p in clients)
        forwarded = relay_forwarded(server)
        print(f"{setup}: {statistics.median(rates):.1f} steps/min, {forwarded} bytes relayed",
              file=sys.stderr)  # fmt: skip
        return {
            "steps_per_minute": statistics.median(rates),
            "relayed_bytes_per_step": forwarded / steps if steps else None,
            "applied_steps": steps,
        }


def steps_per_minute(proc: Proc) -> float:
    """Applied steps per minute between a client's first and last applied step."""
    times = [parse_ts(e["ts"]) for e in proc.events("applied step")]
    if len(times) < 2 or times[-1] <= times[0]:
        raise SystemExit(f"{proc.name}: fewer than 2 applied steps\n{proc.tail(20)}")
    return (len(times) - 1) / (times[-1] - times[0]) * 60


def parse_ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def relay_forwarded(server: Proc) -> int:
    totals = [
        int(line["relay_forwarded_bytes"])
        for line in server.lines()
        if "relay_forwarded_bytes" in line
    ]
    if not totals:
        raise SystemExit(f"the server logged no relay total\n{server.tail(20)}")
    return totals[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=None, help="clients per run (4)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (24)")
    parser.add_argument("--step-delay", type=float, default=None, help="dummy s/batch (0.3)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each setup")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per run (400)")
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's logs here")
    parser.add_argument("--quick", action="store_true", help="2 clients, 5 short steps")
    args = parser.parse_args()
    quick = args.quick
    args.clients = args.clients or (2 if quick else 4)
    args.steps = args.steps or (5 if quick else 24)
    args.step_delay = args.step_delay if args.step_delay is not None else (0.05 if quick else 0.3)
    args.timeout = args.timeout or (120 if quick else 400)
    if os.geteuid() != 0:
        raise SystemExit("bench/netlab.py builds network namespaces: run it as root")
    load_before = os.getloadavg()[0]
    results: dict[str, list[dict[str, Any]]] = {"public": [], "natted": []}
    for repeat in range(args.repeats):
        order = ("public", "natted") if repeat % 2 == 0 else ("natted", "public")
        for setup in order:
            started = time.monotonic()
            if args.keep is not None:
                run_dir = args.keep / f"{setup}-{repeat}"
                run_dir.mkdir(parents=True, exist_ok=True)
                results[setup].append(run_once(setup, args, run_dir))
            else:
                with tempfile.TemporaryDirectory(prefix=f"netlab-bench-{setup}-") as tmp:
                    results[setup].append(run_once(setup, args, Path(tmp)))
            print(f"  ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    medians = {
        setup: statistics.median(r["steps_per_minute"] for r in runs)
        for setup, runs in results.items()
    }
    relayed = [r["relayed_bytes_per_step"] for r in results["natted"]]
    print(
        json.dumps(
            {
                "benchmark": "netlab",
                "quick": quick,
                "clients": args.clients,
                "steps": args.steps,
                "dummy_step_delay_s": args.step_delay,
                "public": {"steps_per_minute": [r["steps_per_minute"] for r in results["public"]]},
                "natted": {"steps_per_minute": [r["steps_per_minute"] for r in results["natted"]]},
                "median_steps_per_minute": medians,
                "natted_over_public": medians["natted"] / medians["public"],
                "relayed_bytes_per_step_natted": statistics.median(relayed),
                "relayed_bytes_per_step_public": statistics.median(
                    r["relayed_bytes_per_step"] for r in results["public"]
                ),
                "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            }
        )
    )


if __name__ == "__main__":
    main()
