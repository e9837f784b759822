"""End-to-end: the coordinator server is SIGKILLed mid-epoch and restarted from its saved file
on the same port while three real client processes keep running.

Checked from the processes' JSON logs: every client logs `reconnected to the server` within
30 s of the restart; the run goes past the saved step; at every step applied after the restart
all clients report the same weights hash; and the loss of the first steps after the restart is
within 10 % of the loss just before the kill (the model was not reset to its start). The
restarted server resumes from `{run_id}-latest.toml`, which names the P2P checkpoint.

`test_restart_mid_epoch_dummy_model` runs the protocol with the dummy backend (its loss falls
with every applied step, so a reset would show); `test_restart_mid_epoch_tiny_model` trains
builtin:llama-tiny on the CPU.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from psyche_common.config import P2PCheckpoint, load_state

from bench.harness.client_run import Cluster, Proc, wait_for, write_state

pytestmark = pytest.mark.timeout(600)

RECONNECT_LIMIT = 30.0
LOSS_WINDOW = 3
STEPS_AFTER = 4


@dataclass(frozen=True)
class Scenario:
    dummy_delay: float | None
    steps_before_kill: int
    max_round_train_time: int


def timestamp(line: dict[str, Any]) -> float:
    return datetime.fromisoformat(line["ts"]).timestamp()


def events_between(proc: Proc, msg: str, start: float, end: float) -> list[dict[str, Any]]:
    return [e for e in proc.events(msg) if start <= timestamp(e) < end]


def mean_loss(lines: list[dict[str, Any]]) -> float:
    values = [float(e["loss"]) for e in lines]
    return sum(values) / len(values)


def run_restart_scenario(tmp_path: Path, scenario: Scenario) -> None:
    cluster = Cluster(
        tmp_path,
        write_state(
            tmp_path / "state.toml",
            total_steps=1000,
            epoch_time=3000,  # one long epoch: the kill is always mid-epoch
            max_round_train_time=scenario.max_round_train_time,
        ),
    )
    save_dir = tmp_path / "saved"
    try:
        cluster.start_server("--save-state-dir", str(save_dir))
        clients = [
            cluster.start_client(
                "--server-reconnect-timeout", "120", dummy_delay=scenario.dummy_delay
            )
            for _ in range(3)
        ]

        def applied_before() -> int:
            return min(len(c.events("applied step")) for c in clients)

        wait_for(
            lambda: applied_before() >= scenario.steps_before_kill,
            300,
            "the clients to apply steps before the kill",
            cluster.diagnostics,
        )
        assert cluster.server is not None
        cluster.server.kill(signal.SIGKILL)
        cluster.server.popen.wait(10)
        killed_at = time.time()
        latest = save_dir / "e2e-run-latest.toml"
        saved = load_state(latest)
        saved_step = saved.progress.step
        assert isinstance(saved.model.checkpoint, P2PCheckpoint), saved.model.checkpoint
        time.sleep(2)  # the clients notice and back off
        assert all(c.popen.poll() is None for c in clients), cluster.diagnostics()

        restarted_at = time.time()  # the reconnect time below includes the server's start-up
        cluster.start_server("--save-state-dir", str(save_dir), state=latest, name="restarted")
        wait_for(
            lambda: all(
                events_between(c, "reconnected to the server", killed_at, 1e12) for c in clients
            ),
            RECONNECT_LIMIT + 5,
            "every client to reconnect",
            cluster.diagnostics,
        )
        delays = [
            timestamp(events_between(c, "reconnected to the server", killed_at, 1e12)[0])
            - restarted_at
            for c in clients
        ]
        print(
            f"saved step {saved_step}; reconnected {[round(d, 1) for d in delays]} s after the restart"
        )
        assert max(delays) <= RECONNECT_LIMIT, delays

        def applied_after(proc: Proc) -> dict[int, str]:
            return {
                e["step"]: e["weights_hash"]
                for e in events_between(proc, "applied step", restarted_at, 1e12)
            }

        wait_for(
            lambda: all(
                len([s for s in applied_after(c) if s > saved_step]) >= STEPS_AFTER for c in clients
            ),
            300,
            f"{STEPS_AFTER} applied steps past the saved step {saved_step}",
            cluster.diagnostics,
        )
        tables = [applied_after(c) for c in clients]
        steps = sorted(set().union(*tables))
        assert steps[0] > saved_step, (steps, saved_step)  # nothing older is applied again
        common = set.intersection(*(set(t) for t in tables))
        assert len(common) >= STEPS_AFTER, (common, tables)
        for step in steps:
            hashes = {t[step] for t in tables if step in t}
            assert len(hashes) == 1, f"weights differ at step {step}: {hashes}"

        for proc in clients:
            before = events_between(proc, "trained step", 0, killed_at)[-LOSS_WINDOW:]
            after = events_between(proc, "trained step", restarted_at, 1e12)[:LOSS_WINDOW]
            assert len(before) == LOSS_WINDOW and len(after) == LOSS_WINDOW, proc.name
            loss_before, loss_after = mean_loss(before), mean_loss(after)
            first = mean_loss(proc.events("trained step")[:LOSS_WINDOW])
            print(
                f"{proc.name}: loss at start {first:.3f}, before the kill {loss_before:.3f}, "
                f"after the restart {loss_after:.3f}"
            )
            # the model learned before the kill, so a model back at its start would show
            assert loss_before < 0.9 * first, (first, loss_before)
            assert abs(loss_after - loss_before) <= 0.1 * loss_before, (loss_before, loss_after)
        assert all(c.popen.poll() is None for c in clients), cluster.diagnostics()
    finally:
        cluster.stop()


def test_restart_mid_epoch_dummy_model(tmp_path: Path) -> None:
    run_restart_scenario(
        tmp_path, Scenario(dummy_delay=0.2, steps_before_kill=10, max_round_train_time=6)
    )


def test_restart_mid_epoch_tiny_model(tmp_path: Path) -> None:
    run_restart_scenario(
        tmp_path, Scenario(dummy_delay=None, steps_before_kill=8, max_round_train_time=20)
    )
