"""`bench/distro.py --study --quick`: the optimizer study's whole code path at a size of
seconds (bench/study/study_protocol.py's QUICK_PROTOCOL) prints the study object of issue
22, with every stage's rows and a frontier computed from them. The figures are too small to
judge; the shape, the stages and the replicas' bit-identity are asserted."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.study.study_protocol import QUICK_PROTOCOL

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
FRONTIER_KEYS = {
    "name",
    "bytes_ratio",
    "loss_vs_adamw_mean",
    "seeds",
    "seed_max_above_mean",
    "tokens_to_target_ratio",
    "diagnostic",
}


def test_the_quick_study_prints_the_study_object(tmp_path: Path) -> None:
    cache = tmp_path / "runs.jsonl"
    command = [sys.executable, "bench/distro.py", "--study", "--quick", "--cache", str(cache)]
    completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = json.loads(completed.stdout)
    for key in ("protocol", "study", "frontier", "best_at_146", "best_at_600", "sweep", "goals"):
        assert key in report, key
    assert report["run_cpu_seconds"] == pytest.approx(
        sum(r["cpu_seconds"] for r in report["study"])
    )
    assert report["run_cpu_seconds"] > 0
    assert report["protocol"]["steps"] == QUICK_PROTOCOL.steps
    rows = report["study"]
    stages = {row["stage"] for row in rows}
    assert stages == {"sweep", "diloco-sweep", "seeds", "synchronous", "diloco"}
    outer = {row["name"] for row in rows if row["stage"] == "diloco-sweep"}
    assert outer == {f"diloco-p2-outer{lr:g}" for lr in QUICK_PROTOCOL.diloco_outer_lrs}
    assert report["sweep"]["diloco"]["outer_lr"] in QUICK_PROTOCOL.diloco_outer_lrs
    assert all(row["replicas_identical"] for row in rows)
    names = {row["name"] for row in rows if row["stage"] == "seeds"}
    assert names == {
        "adamw",
        "distro-p2",
        "distro-p4",
        "sparseloco-p2",
        "sparseloco-p4",
        "sparseloco-templar-p2",
        "sparseloco-templar-p4",
        "sparseloco-codebook-p4",  # a candidate with its own peers and no synchronous twin
        "distro-aggmom-p4",
    }
    seeds = {row["seed"] for row in rows if "sweep" not in row["stage"]}
    assert seeds == set(QUICK_PROTOCOL.seeds)
    compressed = [r for r in rows if r["family"] in ("distro", "sparseloco")]
    assert {r["name"] for r in compressed} >= {"sparseloco-templar-p4"}
    assert all(
        r["captured_energy"] is not None and r["index_overlap"] is not None for r in compressed
    )
    assert all(0.0 < r["captured_energy"] <= 1.0 for r in compressed)
    frontier = report["frontier"]
    assert {e["name"] for e in frontier} == {
        "distro-p2",
        "distro-p4",
        "sparseloco-p2",
        "sparseloco-p4",
        "distro-p2-sync",
        "sparseloco-p2-sync",
        "sparseloco-templar-p2",
        "sparseloco-templar-p4",
        "sparseloco-templar-p2-sync",
        "sparseloco-codebook-p4",
        "distro-aggmom-p4",
        "diloco-p2",
        "diloco-p4",
    }
    for entry in frontier:
        assert set(entry) == FRONTIER_KEYS
        assert len(entry["seeds"]) == len(QUICK_PROTOCOL.seeds)
    diloco = next(e for e in frontier if e["name"] == "diloco-p2")
    assert diloco["bytes_ratio"] == pytest.approx(QUICK_PROTOCOL.diloco.inner_steps)  # type: ignore[union-attr]
    # a second run takes every run from the cache and prints the same study
    again = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "0 runs to do" in again.stderr
    assert json.loads(again.stdout)["frontier"] == frontier


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seeds": (0, 1)}, "must be fresh"),
        ({"peers": (3,)}, "must split over 3 peers"),
        ({"steps": 5}, "multiple of inner_steps"),
        ({"diloco": None}, "diloco_outer_lrs needs diloco"),
    ],
)
def test_a_protocol_that_cannot_run_is_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(QUICK_PROTOCOL, **changes)  # type: ignore[arg-type]
