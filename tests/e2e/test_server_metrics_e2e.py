"""`psyche-server run --metrics-port`: a live run's `/metrics` (real processes: the server and
three dummy-training clients, whose reported loss falls as they apply steps). Scraped twice a
few steps apart: `psyche_loss` is there and moved, `psyche_step` grew, every sample carries the
run's id. Also `--otlp-metrics-url`: the same figures arrive at a local OTLP/HTTP receiver."""

from __future__ import annotations

import re
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from bench.harness.client_run import Cluster, free_port, wait_for, write_state

pytestmark = pytest.mark.timeout(240)

SAMPLE = re.compile(r'^(psyche_\w+)\{run_id="([^"]*)"\} (\S+)$')


def scrape(port: int) -> dict[str, float]:
    """`name -> value` of every psyche_ sample, asserting each has the run's id."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            assert match.group(2) == "metrics-run", line
            samples[match.group(1)] = float(match.group(3))
    return samples


class OtlpReceiver(BaseHTTPRequestHandler):
    """Records the metric names (with their run_id attribute) of each OTLP/HTTP export."""

    received: ClassVar[list[tuple[str, str]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points = metric.gauge.data_points or metric.sum.data_points
                    for point in points:
                        run_id = {a.key: a.value.string_value for a in point.attributes}
                        self.received.append((metric.name, run_id.get("run_id", "")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_metrics_endpoint_serves_a_loss_that_moves(tmp_path: Path) -> None:
    state = write_state(
        tmp_path / "state.toml",
        run_id="metrics-run",
        total_steps=40,
        warmup_time=2,
        witness_nodes=0,
        max_round_train_time=10,
    )
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), OtlpReceiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    otlp_url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/metrics"
    metrics_port = free_port()
    c = Cluster(tmp_path, state)
    try:
        c.start_server(
            "--metrics-port",
            str(metrics_port),
            "--otlp-metrics-url",
            otlp_url,
            "--otlp-metrics-interval",
            "1",
        )
        wait_for(lambda: "psyche_step" in scrape(metrics_port), 30, "the metrics endpoint")
        assert "psyche_loss" not in scrape(metrics_port)  # no witness yet: absent, not 0
        for _ in range(3):
            c.start_client(dummy_delay=0.2, run_id="metrics-run")
        first: dict[str, float] = {}

        def has_loss() -> bool:
            first.update(scrape(metrics_port))
            return "psyche_loss" in first

        wait_for(has_loss, 120, "a loss on /metrics", c.diagnostics)
        later: dict[str, float] = {}

        def moved() -> bool:
            later.update(scrape(metrics_port))
            return later["psyche_step"] >= first["psyche_step"] + 3

        wait_for(moved, 120, "three more steps on /metrics", c.diagnostics)
        assert later["psyche_loss"] != first["psyche_loss"], (first, later)
        assert later["psyche_metrics_step"] > first["psyche_metrics_step"]
        assert later["psyche_members"] == 3
        assert later["psyche_tokens_per_second"] > 0
        assert later["psyche_witness_reports_total"] > first["psyche_witness_reports_total"]
        assert later["psyche_convictions_total"] == 0
        wait_for(
            lambda: ("psyche_loss", "metrics-run") in OtlpReceiver.received,
            30,
            "psyche_loss over OTLP",
        )
        names = {name for name, _ in OtlpReceiver.received}
        assert {"psyche_step", "psyche_members", "psyche_convictions_total"} <= names
    finally:
        c.stop()
        receiver.shutdown()
