"""One run with a mid-epoch joiner (`[config] join_mid_epoch`): dummy members against a real
`psyche-server`, one more client started while the epoch runs, read back from the processes'
logs; used by `tests/e2e/test_join_mid_epoch_e2e.py` and `bench/mixed.py`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.harness.client_run import Cluster, Proc, wait_for
from bench.harness.mixed_run import dropped_clients, hashes_agree, mixed_state, with_options


@dataclass(frozen=True)
class JoinOutcome:
    join_step: int
    """The coordinator step when the joiner connected (its first state)."""
    first_applied_step: int | None
    """The step of the first apply that took a result of the joiner (a member's log)."""
    join_to_first_applied_seconds: float | None
    """From starting the joiner's process to that apply."""
    hashes_agree: bool
    """Every client, the joiner too, had the same weights hash at every step they applied."""
    joiner_steps: int
    """Steps the joiner applied, and the others too (what `hashes_agree` compared)."""
    dropped: int
    exit_codes: list[int | None]

    @property
    def join_to_first_applied_rounds(self) -> int | None:
        if self.first_applied_step is None:
            return None
        return self.first_applied_step - self.join_step


def _timestamp(line: dict[str, object]) -> float:
    return datetime.fromisoformat(str(line["ts"])).timestamp()


def _joiner_id(joiner: Proc, timeout: float) -> str:
    found: list[str] = []

    def named() -> bool:
        found.extend(str(line["client_id"]) for line in joiner.events_with("client_id")[:1])
        return bool(found)

    wait_for(named, timeout, "the joiner's first log line with its id", joiner.tail)
    return found[0]


def run_join(
    tmp: Path,
    *,
    members: int = 3,
    steps: int = 16,
    join_after_step: int = 4,
    batch: int = 16,
    seconds_per_sample: float = 0.01,
    timeout: float = 300,
    real_model: bool = False,
) -> JoinOutcome:
    """`members` dummy clients (with `real_model`, `builtin:llama-tiny` on CPU) train `steps`
    steps of `batch` samples, every one a witness, with per-client shares and mid-epoch joins
    on; once client 0 applied `join_after_step`, one more client starts. Waits for every
    client to exit."""
    tmp.mkdir(parents=True, exist_ok=True)
    state = mixed_state(tmp, members, steps, batch, 30, epoch_time=3600)
    with_options(state, {"join_mid_epoch": "true", "per_client_shares": "true"})
    cluster = Cluster(tmp, state)
    extra = () if real_model else ("--dummy-seconds-per-sample", str(seconds_per_sample))
    dummy = None if real_model else 0.0
    try:
        cluster.start_server()
        procs = [cluster.start_client(*extra, dummy_delay=dummy) for _ in range(members)]
        wait_for(
            lambda: any(int(e["step"]) >= join_after_step for e in procs[0].events("applied step")),
            timeout,
            f"client 0 to apply step {join_after_step}",
            cluster.diagnostics,
        )
        started = time.time()
        joiner = cluster.start_client(*extra, dummy_delay=dummy)
        joiner_id = _joiner_id(joiner, 60)
        wait_for(
            lambda: all(p.popen.poll() is not None for p in [*procs, joiner]),
            timeout,
            "the clients to finish",
            cluster.diagnostics,
        )
        states = [line for line in joiner.events_with("step") if "state" in line]
        join_step = int(states[0]["step"]) if states else 0
        taken = [
            line
            for line in procs[0].events("applied step")
            if joiner_id in (line.get("senders") or [])
        ]
        first = min(taken, key=lambda line: int(line["step"])) if taken else None
        agree, common = hashes_agree([*procs, joiner])
        return JoinOutcome(
            join_step=join_step,
            first_applied_step=None if first is None else int(first["step"]),
            join_to_first_applied_seconds=(
                None if first is None else round(_timestamp(first) - started, 2)
            ),
            hashes_agree=agree,
            joiner_steps=common,
            dropped=dropped_clients(cluster),
            exit_codes=[p.popen.returncode for p in [*procs, joiner]],
        )
    finally:
        cluster.stop()
