"""Real processes: a server and two dummy-training clients writing their event files into one
`--events-dir`, one client serving `--metrics-local-port` (scraped over HTTP while it trains),
then `psyche-server observe` printing the run's history from the files; `--logs none` prints
nothing while `--write-log` still gets the lines; `--logs tui-and-console` refuses a stdout that
is the terminal."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from bench.harness.client_run import BIN, Cluster, no_server_train, wait_for, write_state

pytestmark = pytest.mark.timeout(240)

SAMPLE = re.compile(r'^(psyche_client_\w+)\{client="([0-9a-f]{8})",run_id="([^"]*)"\} (\S+)$')


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            assert match.group(3) == "events-run", line
            samples[match.group(1)] = float(match.group(4))
    return samples


def test_event_files_of_a_run_and_observe(tmp_path: Path) -> None:
    events = tmp_path / "events"
    state = write_state(
        tmp_path / "state.toml",
        run_id="events-run",
        total_steps=8,
        warmup_time=2,
        witness_nodes=0,
        init_min_clients=2,
        max_round_train_time=10,
    )
    c = Cluster(tmp_path, state)
    try:
        c.start_server("--events-dir", str(events))
        watched = c.start_client(
            "--events-dir",
            str(events),
            "--metrics-local-port",
            "0",
            dummy_delay=0.2,
            run_id="events-run",
        )
        c.start_client("--events-dir", str(events), dummy_delay=0.2, run_id="events-run")
        ports: list[int] = []

        def port_logged() -> bool:
            ports.extend(int(e["metrics_port"]) for e in watched.events_with("metrics_port"))
            return bool(ports)

        wait_for(port_logged, 60, "the client's metrics port", c.diagnostics)
        seen: dict[str, float] = {}

        def trained() -> bool:
            seen.update(scrape(ports[0]))
            return "psyche_client_loss" in seen and seen["psyche_client_step"] >= 3

        wait_for(trained, 120, "a loss and step 3 on the client's port", c.diagnostics)
        assert seen["psyche_client_p2p_sent_bytes_total"] > 0
        assert seen["psyche_client_round_seconds"] > 0
        wait_for(
            lambda: all(p.popen.poll() is not None for p in c.clients),
            120,
            "the clients to finish",
            c.diagnostics,
        )
        assert [p.popen.returncode for p in c.clients] == [0, 0], c.diagnostics()
    finally:
        c.stop()
    sources = sorted(p.name for p in events.iterdir())
    assert len(sources) == 3 and "coordinator" in sources, sources
    observed = subprocess.run(
        [str(BIN / "psyche-server"), "observe", "--events-dir", str(events)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert observed.returncode == 0, observed.stderr
    out = observed.stdout
    assert "coordinator: " in out and "Finished epoch" in out
    assert re.search(r"step \d+ finished, loss [0-9.]+", out), out
    assert "RoundTrain -> RoundWitness" in out
    assert out.count("stopped") >= 2  # both clients closed their files
    assert "Traceback" not in observed.stderr


def test_logs_none_prints_nothing_but_write_log_still_gets_the_lines(tmp_path: Path) -> None:
    log_file = tmp_path / "client.jsonl"
    result = subprocess.run(
        no_server_train("--logs", "none", "--write-log", str(log_file)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stdout == "" and result.stderr == ""
    assert "127.0.0.1:9" in log_file.read_text()


def test_tui_and_console_refuses_a_terminal_stdout() -> None:
    leader, follower = pty.openpty()
    try:
        result = subprocess.run(
            no_server_train("--logs", "tui-and-console"),
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert result.returncode == 2
    assert "redirect stdout" in result.stderr and "Traceback" not in result.stderr
