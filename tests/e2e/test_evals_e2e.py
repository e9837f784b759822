"""Evals during a real run (real processes: the server with `--metrics-port` and two clients
training `builtin:llama-tiny` with `--eval-tasks` on a tiny local multiple-choice task and
`--eval-heldout-every`, two short epochs: scores measured in one Cooldown reach the server with
the next epoch's witness reports): every client logs `eval scores` lines (lm-eval scores and the held-out
loss, the tasks scored again once training changed the weights), clients with the same weights
log the same scores, the training hashes still agree, and
the server serves the scores the witnesses reported as `psyche_eval` gauges."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from bench.harness.client_run import Cluster, applied_hashes, free_port, wait_for, write_state
from bench.support.eval_tasks import write_tasks

pytestmark = pytest.mark.timeout(240)

EVAL_SAMPLE = re.compile(r'^psyche_eval\{eval="([^"]+)",run_id="evals-run"\} (\S+)$', re.M)


def server_evals(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {name: float(value) for name, value in EVAL_SAMPLE.findall(text)}


def test_eval_scores_reach_the_logs_and_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    tasks = write_tasks(tmp_path / "tasks")
    state = write_state(
        tmp_path / "state.toml",
        run_id="evals-run",
        total_steps=14,
        epoch_time=8,
        max_round_train_time=4,
        cooldown_time=4,
        warmup_time=4,
        init_min_clients=2,
        min_clients=2,
        witness_nodes=0,
    )
    metrics_port = free_port()
    c = Cluster(tmp_path, state)
    try:
        c.start_server("--metrics-port", str(metrics_port))
        eval_flags = (
            "--eval-tasks",
            "tiny_mc",
            "--eval-tasks-dir",
            str(tasks),
            "--eval-task-max-docs",
            "3",
            "--eval-heldout-every",
            "2",
            "--eval-heldout-sequences",
            "4",
        )
        clients = [c.start_client(*eval_flags, run_id="evals-run") for _ in range(2)]
        seen: dict[str, float] = {}

        def server_has_both() -> bool:
            seen.update(server_evals(metrics_port))
            return {"tiny_mc", "heldout_loss"} <= set(seen)

        wait_for(server_has_both, 150, "eval scores at the server", c.diagnostics)
        assert 0.0 <= seen["tiny_mc"] <= 1.0
        assert seen["heldout_loss"] > 0
        assert c.server is not None and c.server.events("eval scores reported")

        def rescored_after_training() -> bool:
            """Both kinds in every client's log, the tasks scored again on trained weights."""
            for p in clients:
                events = p.events("eval scores")
                scored = {e["weights_hash"] for e in events if e["eval_kind"] == "lm-eval"}
                if {e["eval_kind"] for e in events} != {"lm-eval", "heldout"} or len(scored) < 2:
                    return False
            return True

        wait_for(rescored_after_training, 120, "evals on trained weights", c.diagnostics)
        assert all(p.popen.poll() in (None, 0) for p in clients), c.diagnostics()
        by_hash: dict[str, dict[str, float]] = {}
        for proc in clients:
            for event in proc.events("eval scores"):
                if event["eval_kind"] == "lm-eval":
                    assert set(event["evals"]) == {"tiny_mc"}
                    assert {"tiny_mc/acc", "tiny_mc/acc_norm"} <= set(event["metrics"])
                    previous = by_hash.setdefault(event["weights_hash"], event["evals"])
                    assert previous == event["evals"]  # equal weights, equal scores
                else:
                    assert event["evals"]["heldout_loss"] > 0
        first, second = (applied_hashes(p) for p in clients)
        common = sorted(set(first) & set(second))
        assert common and all(first[s] == second[s] for s in common)
    finally:
        c.stop()
