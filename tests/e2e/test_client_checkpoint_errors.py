"""End-to-end: a client whose checkpoints cannot be written keeps training.

A real server and two real client processes (dummy backend) run several epochs. One client's
`--checkpoint-dir` is a directory when it starts (the start-up check passes) and is replaced by a
regular file once the client has joined, so every save fails (whoever runs the test, root
included), as a disk that fills or goes read-only mid-run would. That client logs each failure,
trains on through the following epochs and exits 0 when the run finishes; the other saves
complete checkpoints only. (A `--checkpoint-dir` that cannot be created at all is refused at
start-up; tests/e2e/test_client_bad_inputs.py covers that.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.harness.client_run import Cluster, applied_hashes, wait_for, write_state

pytestmark = pytest.mark.timeout(300)


def test_a_client_that_cannot_save_checkpoints_trains_on(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml",
        init_min_clients=2,
        witness_nodes=0,
        warmup_time=4,
        cooldown_time=2,
        epoch_time=8,
        max_round_train_time=5,
        total_steps=16,
    )
    broken_dir, good_dir = tmp_path / "broken-checkpoints", tmp_path / "checkpoints"
    cluster = Cluster(tmp_path, state)
    try:
        cluster.start_server()
        broken = cluster.start_client("--checkpoint-dir", str(broken_dir), dummy_delay=0.2)
        good = cluster.start_client("--checkpoint-dir", str(good_dir), dummy_delay=0.2)
        clients = [broken, good]
        wait_for(
            lambda: (
                broken.popen.poll() is not None
                or any("connected to server" in str(line.get("msg")) for line in broken.lines())
            ),
            60,
            "the first client to join",
            cluster.diagnostics,
        )
        assert broken.popen.poll() is None, cluster.diagnostics()
        shutil.rmtree(broken_dir)
        broken_dir.write_text("a file where the checkpoint directory should be")
        wait_for(
            # a client that fails ends the wait at once: its peer would wait for it forever
            lambda: (
                all(p.popen.poll() is not None for p in clients)
                or any(p.popen.poll() not in (None, 0) for p in clients)
            ),
            240,
            "both clients to finish the run",
            cluster.diagnostics,
        )
        assert [p.popen.returncode for p in clients] == [0, 0], cluster.diagnostics()
    finally:
        cluster.stop()

    failures = [
        line for line in broken.lines() if str(line.get("msg", "")).startswith("checkpoint failed")
    ]
    assert len(failures) >= 2, cluster.diagnostics()  # one per Cooldown, each tried again
    for line in failures:
        assert line["level"] == "ERROR"
        step = line["checkpoint_step"]
        assert str(broken_dir / f"e2e-run-step{step}") in line["error"]
    # it trained and applied in the epoch after its first failed checkpoint, in step with the
    # other client
    first_failure = min(line["checkpoint_step"] for line in failures)
    assert [e for e in broken.events("trained step") if e["step"] > first_failure + 1]
    mine, theirs = applied_hashes(broken), applied_hashes(good)
    later = [s for s in mine if s > first_failure + 1 and s in theirs]
    assert later, cluster.diagnostics()
    assert all(mine[s] == theirs[s] for s in later)
    # the other client's checkpoints are all complete: no temporary directories left
    saved = sorted(p.name for p in good_dir.iterdir())
    assert saved and all(name.startswith("e2e-run-step") for name in saved), saved
    assert broken_dir.is_file()
