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

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psyche_common.metrics_http import MetricsHttpServer

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


class LocalMetricsServer(MetricsHttpServer):
    def __init__(self, port: int, run_id: str, client: str) -> None:
        self.run_id = run_id
        self.client = client
        self.figures = LiveFigures()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_FiguresCollector(self))
        super().__init__(registry, HOST, port)

    def publish(self, figures: LiveFigures) -> None:
        self.figures = figures
