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


def with_options(state: Path, options: dict[str, str]) -> None:
    """Add `[config]` options (TOML values as text) to a state file `write_state` wrote."""
    text = state.read_text()
    lines = "".join(f"{key} = {value}\n" for key, value in options.items())
    state.write_text(text.replace("[config]\n", f"[config]\n{lines}", 1))


def mixed_state(
    tmp: Path, clients: int, steps: int, batch: int, max_round_train_time: int, **extra: object
) -> Path:
    """The state file of a mixed run: every member a witness, RoundWitness 0.5 s."""
    return write_state(
        tmp / "state.toml",
        total_steps=steps,
        init_min_clients=clients,
        min_clients=2,
        witness_nodes=0,
        batch=batch,
        max_round_train_time=max_round_train_time,
        round_witness_time=0.5,
        **extra,
    )


def hashes_agree(procs: list[Proc]) -> tuple[bool, int]:
    """Whether every client had the same weights hash at every step they all applied, and at
    how many steps."""
    tables = [applied_hashes(p) for p in procs]
    common = sorted(set.intersection(*(set(t) for t in tables)))
    return bool(common) and all(len({t[s] for t in tables}) == 1 for s in common), len(common)


def dropped_clients(cluster: Cluster) -> int:
    """Clients the coordinator dropped through health checks (the server's log)."""
    assert cluster.server is not None
    return sum(
        int(line.get("dropped", 0))
        for line in cluster.server.lines()
        if str(line.get("msg", "")).startswith("health check from")
    )


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
    state = mixed_state(tmp, clients, steps, batch, max_round_train_time)
    if shares:
        with_options(
            state, {"per_client_shares": "true", "max_share_multiple": str(max_share_multiple)}
        )
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
        agree, common = hashes_agree(procs)
        trained = [
            {int(e["step"]): int(e.get("samples", 0)) for e in p.events("trained step")}
            for p in procs
        ]
        return MixedOutcome(
            samples_per_second=_samples_per_second(procs[0], batch, clients),
            trained=trained,
            hashes_agree=agree,
            common_steps=common,
            dropped=dropped_clients(cluster),
            exit_codes=[p.popen.returncode for p in procs],
        )
    finally:
        cluster.stop()
