"""`LocalMetricsServer`: the client's figures in the Prometheus text format on
`http://127.0.0.1:PORT/metrics` (`--metrics-local-port`).

prometheus-client's HTTP server thread serves a registry holding one collector that reads the
latest `live_figures.LiveFigures` the event loop published (`publish`, a reference swap): a
scrape never waits on the event loop. Every metric carries the labels `run_id` and `client`
(the short id); `psyche_client_run_state` is 1 with the state as its `state` label, and
`psyche_client_eval` has one sample per eval (`eval` label).
"""

from __future__ import annotations

from collections.abc import Iterator
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from psyche_client.metrics.live_figures import SPECS, LiveFigures

HOST = "127.0.0.1"


class _FiguresCollector(Collector):
    def __init__(self, server: LocalMetricsServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        figures = self.server.figures
        labels = ["run_id", "client"]
        values = [self.server.run_id, self.server.client]
        for spec in SPECS:
            value = figures.values.get(spec.name)
            if value is None:
                continue
            family: GaugeMetricFamily | CounterMetricFamily
            if spec.counter:
                family = CounterMetricFamily(spec.name, spec.help, labels=labels)
            else:
                family = GaugeMetricFamily(spec.name, spec.help, labels=labels)
            family.add_metric(values, value)
            yield family
        if figures.run_state:
            state = GaugeMetricFamily(
                "psyche_client_run_state",
                "1 for the coordinator's current run state (the state label)",
                labels=[*labels, "state"],
            )
            state.add_metric([*values, figures.run_state], 1.0)
            yield state
        if figures.evals:
            evals = GaugeMetricFamily(
                "psyche_client_eval", "the latest score of each eval", labels=[*labels, "eval"]
            )
            for name, score in sorted(figures.evals.items()):
                evals.add_metric([*values, name], score)
            yield evals


class LocalMetricsServer:
    def __init__(self, port: int, run_id: str, client: str) -> None:
        self.run_id = run_id
        self.client = client
        self.figures = LiveFigures()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_FiguresCollector(self))
        self._requested_port = port
        self._server: WSGIServer | None = None
        self._thread: Thread | None = None

    def start(self) -> int:
        """Bind and serve from a daemon thread; returns the port (OSError when it is taken)."""
        self._server, self._thread = start_http_server(
            self._requested_port, addr=HOST, registry=self.registry
        )
        return int(self._server.server_address[1])

    def publish(self, figures: LiveFigures) -> None:
        self.figures = figures

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
