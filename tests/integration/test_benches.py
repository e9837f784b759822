"""Every `bench/*.py` runs: its `--quick` mode exits 0 and prints exactly one JSON object.

Each bench runs as `make bench` runs it (this interpreter, the repository root as working
directory), at the smallest size that still takes its whole code path. Only completion and
the shape of the output are asserted: quick figures are too small and noisy to judge.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.harness.netlab.shell import unavailable_reason

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Bench:
    name: str
    keys: tuple[str, ...]
    """Top-level keys the bench's JSON always holds."""
    timeout: float


BENCHES = [
    Bench(
        "coordinator",
        ("clients_256", "ratio_vs_msgpack_encode", "members_10000", "ratio_10000_vs_256"),
        120,
    ),
    Bench(
        "distro",
        ("result_bytes", "ratio_vs_bf16", "decode_apply_ms_by_results", "convergence"),
        180,
    ),
    Bench("server", ("baseline", "results", "ratios_vs_baseline", "goals", "load_average"), 180),
    Bench(
        "secure_link",
        ("plain", "encrypted", "model_share", "round_latency", "state_seal", "load_average"),
        120,
    ),
    Bench(
        "client",
        ("client_over_bare_long_step", "cases", "joiner_fetch_ratio_p2p_over_raw"),
        240,
    ),
    Bench("verification", ("cases", "recompute_seconds_median", "samples"), 180),
    Bench("convictions", ("settings", "false_convictions", "old_rule_false_convictions"), 180),
    Bench("negated_gradients", ("variants", "loss_vs_left_out", "settings"), 180),
    Bench(
        "mixed",
        ("shares_over_equal", "dropped", "hashes_agree", "runs", "join_to_first_applied_rounds"),
        360,
    ),
    Bench("parallel", ("tokens_per_sec", "ratio_2_over_1", "load_average_after"), 180),
    Bench("memory", ("setup", "runs"), 240),
    Bench("attacks", ("attacks", "clean", "untrained_loss"), 600),
    Bench("netlab", ("median_steps_per_minute", "natted_over_public"), 400),
]


def marks(bench: Bench) -> list[pytest.MarkDecorator]:
    if bench.name == "attacks":
        # two runs of a server and 3 client processes each: minutes on a loaded 2-core machine
        return [pytest.mark.slow]
    return []


def run_quick(bench: Bench) -> dict[str, Any]:
    """Run `bench/NAME.py --quick`; its stdout parsed as one JSON object."""
    completed = subprocess.run(
        [sys.executable, f"bench/{bench.name}.py", "--quick"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=bench.timeout,
    )
    assert completed.returncode == 0, (
        f"bench/{bench.name}.py --quick exited {completed.returncode}:\n{completed.stderr[-4000:]}"
    )
    # raw_decode + the rest being blank: exactly one object, nothing before or after it
    report, end = json.JSONDecoder().raw_decode(completed.stdout.lstrip())
    assert completed.stdout.lstrip()[end:].strip() == "", "more than one JSON value on stdout"
    assert isinstance(report, dict)
    return report


@pytest.mark.parametrize("bench", [pytest.param(b, id=b.name, marks=marks(b)) for b in BENCHES])
def test_quick_mode_prints_one_json_object(bench: Bench) -> None:
    if bench.name == "netlab" and (reason := unavailable_reason()) is not None:
        pytest.skip(f"network lab unavailable: {reason}")
    report = run_quick(bench)
    assert report["benchmark"] == bench.name
    assert report["quick"] is True
    missing = [key for key in bench.keys if key not in report]
    assert not missing, f"bench/{bench.name}.py printed no {missing}: {sorted(report)}"


def test_every_bench_is_covered() -> None:
    """A new `bench/*.py` gets a quick mode and a row here."""
    scripts = {path.stem for path in (REPO_ROOT / "bench").glob("*.py")}
    assert scripts == {bench.name for bench in BENCHES}
