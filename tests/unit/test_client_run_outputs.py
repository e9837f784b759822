"""The client's local outputs (`metrics.run_outputs`): `--metrics-local-port` serves the live
figures over HTTP in the Prometheus text format, `--events-dir` records state changes, steps
and warnings; each refuses to start with a line naming its flag."""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from pathlib import Path

import pytest
from psyche_client.metrics.options import MetricsOptions
from psyche_client.metrics.run_outputs import RunOutputs
from psyche_client.metrics.sink import MetricsStartError
from psyche_client.p2p.stats import TransferStats
from psyche_client.round.stats import ClientStats
from psyche_common.coordinator import RunState
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in, ids


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def test_the_local_port_serves_the_live_figures() -> None:
    stats, traffic = ClientStats(), TransferStats()
    identity = Identity.generate()
    outputs = RunOutputs.open(
        MetricsOptions(local_port=0), "run-x", identity.public_key, stats, traffic
    )
    try:
        assert outputs.port is not None and outputs.events is None
        port = outputs.port.port
        stats.losses.append((3, 2.25))
        stats.step_durations.append(1.5)
        traffic.record_sent(None, 1000)
        coordinator = coordinator_in(RunState.RoundTrain, ids(2), step=3)
        stats.observe_state(coordinator)
        outputs.observe(coordinator)
        text = scrape(port)
        labels = f'client="{identity.short_id}",run_id="run-x"'
        assert f"psyche_client_loss{{{labels}}} 2.25" in text
        assert f"psyche_client_step{{{labels}}} 3.0" in text
        assert f"psyche_client_round_seconds{{{labels}}} 1.5" in text
        assert f"psyche_client_p2p_sent_bytes_total{{{labels}}} 1000.0" in text
        assert f'psyche_client_run_state{{{labels},state="RoundTrain"}} 1.0' in text
    finally:
        outputs.close()


def test_a_taken_port_stops_the_start_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsStartError, match=f"--metrics-local-port {port}"):
            RunOutputs.open(
                MetricsOptions(local_port=port),
                "r",
                Identity.generate().public_key,
                ClientStats(),
                TransferStats(),
            )


def test_the_event_files_record_states_steps_and_warnings(tmp_path: Path) -> None:
    identity = Identity.generate()
    outputs = RunOutputs.open(
        MetricsOptions(events_dir=tmp_path, keep_event_files=1),
        "run-x",
        identity.public_key,
        ClientStats(),
        TransferStats(),
    )
    try:
        assert outputs.sink is not None
        for state, step, epoch in (
            (RunState.RoundTrain, 1, 0),
            (RunState.RoundTrain, 1, 0),  # unchanged: no line
            (RunState.RoundWitness, 1, 0),
            (RunState.RoundTrain, 5, 1),  # a new epoch: a new file, the old one deleted
        ):
            outputs.observe(coordinator_in(state, ids(2), step=step, epoch=epoch))
        outputs.sink.log(5, {"train/loss": 1.5})
        logging.getLogger("psyche.client").warning("peer %s is slow", "ab12")
        logging.getLogger("psyche.client").info("round started")  # not a milestone
    finally:
        outputs.close()
    files = list((tmp_path / identity.public_key.hex()).iterdir())
    assert len(files) == 1 and "epoch-1" in files[0].name
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    kinds = [line["kind"] for line in lines]
    assert kinds == ["run_started", "state_changed", "step", "log", "stopped"]
    assert lines[1]["old_state"] == "RoundWitness" and lines[1]["step"] == 5
    assert lines[2]["figures"] == {"train/loss": 1.5}
    assert lines[3]["level"] == "WARNING" and lines[3]["msg"] == "peer ab12 is slow"


def test_an_unwritable_events_dir_stops_the_start_naming_the_flag(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(MetricsStartError, match="--events-dir"):
        RunOutputs.open(
            MetricsOptions(events_dir=tmp_path / "file"),
            "r",
            Identity.generate().public_key,
            ClientStats(),
            TransferStats(),
        )
