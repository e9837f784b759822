"""One run of dummy clients of different speeds (`--dummy-seconds-per-sample`) against a real
`psyche-server`, with or without per-client shares, read back from the processes' logs; used
by `tests/e2e/test_mixed_speeds_e2e.py` and `bench/mixed.py`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.harness.client_run import Cluster, Proc, applied_hashes, wait_for, write_state


@dataclass(frozen=True)
class MixedOutcome:
    samples_per_second: float
    """Samples of the applied steps of the second half of the run, per second (client 0's
    `applied step` lines: the global batch times the share of the step's results applied)."""
    trained: list[dict[int, int]]
    """Per client: step → samples it trained (its `trained step` lines)."""
    hashes_agree: bool
    common_steps: int
    dropped: int
    """Clients the coordinator dropped (health checks, from the server's log)."""
    exit_codes: list[int | None]


def _with_shares(state: Path, max_share_multiple: int) -> None:
    text = state.read_text()
    options = f"[config]\nper_client_shares = true\nmax_share_multiple = {max_share_multiple}\n"
    state.write_text(text.replace("[config]\n", options, 1))


def _samples_per_second(proc: Proc, batch: int, trainers: int) -> float:
    applied = sorted(
        (line["step"], datetime.fromisoformat(line["ts"]).timestamp(), int(line["results"]))
        for line in proc.events("applied step")
    )
    window = applied[len(applied) // 2 :]
    if len(window) < 2:
        return 0.0
    seconds = window[-1][1] - window[0][1]
    samples = sum(batch * min(results, trainers) / trainers for _, _, results in window[1:])
    return samples / seconds if seconds > 0 else 0.0


def run_mixed(
    tmp: Path,
    seconds_per_sample: list[float],
    *,
    steps: int,
    batch: int,
    shares: bool,
    max_share_multiple: int = 4,
    timeout: float = 400,
    programs: dict[int, list[str]] | None = None,
    max_round_train_time: int = 60,
    real_model: bool = False,
) -> MixedOutcome:
    """`len(seconds_per_sample)` dummy clients, every one a witness, `steps` steps of `batch`
    samples (`programs`: client index → another program given `psyche-client`'s arguments);
    waits for every client to exit. With `real_model` the clients train `builtin:llama-tiny`
    on CPU instead (`seconds_per_sample` then only counts them: a program makes one slower)."""
    tmp.mkdir(parents=True, exist_ok=True)
    clients = len(seconds_per_sample)
    state = write_state(
        tmp / "state.toml",
        total_steps=steps,
        init_min_clients=clients,
        min_clients=2,
        witness_nodes=0,
        batch=batch,
        max_round_train_time=max_round_train_time,
        round_witness_time=0.5,
    )
    if shares:
        _with_shares(state, max_share_multiple)
    cluster = Cluster(tmp, state)
    try:
        cluster.start_server()
        procs = [
            cluster.start_client(
                *(() if real_model else ("--dummy-seconds-per-sample", str(cost))),
                dummy_delay=None if real_model else 0.0,
                program=(programs or {}).get(index),
            )
            for index, cost in enumerate(seconds_per_sample)
        ]
        wait_for(
            lambda: all(p.popen.poll() is not None for p in procs),
            timeout,
            "the clients to finish",
            cluster.diagnostics,
        )
        tables = [applied_hashes(p) for p in procs]
        common = sorted(set.intersection(*(set(t) for t in tables)))
        agree = bool(common) and all(len({t[step] for t in tables}) == 1 for step in common)
        assert cluster.server is not None
        dropped = sum(
            int(line.get("dropped", 0))
            for line in cluster.server.lines()
            if str(line.get("msg", "")).startswith("health check from")
        )
        trained = [
            {int(e["step"]): int(e.get("samples", 0)) for e in p.events("trained step")}
            for p in procs
        ]
        return MixedOutcome(
            samples_per_second=_samples_per_second(procs[0], batch, clients),
            trained=trained,
            hashes_agree=agree,
            common_steps=len(common),
            dropped=dropped,
            exit_codes=[p.popen.returncode for p in procs],
        )
    finally:
        cluster.stop()
