"""Exporting `run_metrics.MetricsSnapshot` to metrics systems, off the event loop.

The event loop publishes a new immutable snapshot (`run_metrics.MetricsBoard`) after each tick;
the exporters only read the latest one from their own threads, so a scrape or an export never
waits on the event loop and never sees a half-updated figure:

- `PrometheusExporter` (`--metrics-port`): prometheus-client's HTTP server thread serves
  `/metrics` in the Prometheus text format from a registry holding one collector,
  `SnapshotCollector`, that turns the snapshot into `psyche_*` metric families.
- `OtlpExporter` (`--otlp-metrics-url`): the OpenTelemetry SDK's periodic reader thread pushes
  the same figures as observable instruments over OTLP/HTTP (imported only when asked for).

Every metric carries the `run_id` label (an OpenTelemetry attribute); the eval scores
(`psyche_eval`, `psyche_eval_step`) also carry `eval`, the task or metric name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psyche_common.metrics_http import MetricsHttpServer

from .run_metrics import MetricsBoard, MetricsSnapshot

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider

log = logging.getLogger("psyche.server")


@dataclass(frozen=True)
class MetricSpec:
    """One exported figure: its name (without `_total`), help text, kind and reader."""

    name: str
    help: str
    counter: bool
    read: Callable[[MetricsSnapshot], float | None]


def _latest(field: str) -> Callable[[MetricsSnapshot], float | None]:
    def read(snapshot: MetricsSnapshot) -> float | None:
        latest = snapshot.latest
        return None if latest is None else getattr(latest, field)

    return read


def _positive(
    read: Callable[[MetricsSnapshot], float | None],
) -> Callable[[MetricsSnapshot], float | None]:
    """Bandwidth is left out until some witness reports a non-zero figure."""

    def positive(snapshot: MetricsSnapshot) -> float | None:
        value = read(snapshot)
        return value if value else None

    return positive


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "psyche_loss",
        "training loss at psyche_metrics_step: the median over that step's witnesses",
        False,
        _latest("loss"),
    ),
    MetricSpec(
        "psyche_tokens_per_second",
        "training throughput of one client (tokens/s) at psyche_metrics_step: the median over "
        "that step's witnesses",
        False,
        _latest("tokens_per_sec"),
    ),
    MetricSpec(
        "psyche_bandwidth_bytes_per_second",
        "P2P bandwidth (bytes/s) at psyche_metrics_step: the median over that step's "
        "witnesses (absent while none reports one)",
        False,
        _positive(_latest("bandwidth_per_sec")),
    ),
    MetricSpec(
        "psyche_metrics_step",
        "the step psyche_loss and psyche_tokens_per_second describe",
        False,
        lambda s: None if s.latest is None else float(s.latest.step),
    ),
    MetricSpec(
        "psyche_metrics_witnesses",
        "witnesses behind psyche_loss (reports at psyche_metrics_step)",
        False,
        lambda s: None if s.latest is None else float(s.latest.reports),
    ),
    MetricSpec("psyche_step", "the coordinator's current step", False, lambda s: s.step),
    MetricSpec("psyche_epoch", "the coordinator's current epoch", False, lambda s: s.epoch),
    MetricSpec("psyche_members", "clients of the current epoch", False, lambda s: float(s.members)),
    MetricSpec(
        "psyche_pending_clients",
        "clients joined for the next epoch (connected, not kicked)",
        False,
        lambda s: float(s.pending),
    ),
    MetricSpec(
        "psyche_witness_reports",
        "witness reports accepted since the server started",
        True,
        lambda s: s.witness_reports_total,
    ),
    MetricSpec(
        "psyche_convictions",
        "verifier convictions since the server started",
        True,
        lambda s: s.convictions_total,
    ),
    MetricSpec(
        "psyche_departures",
        "clients that left an epoch (dropped, ejected, withdrawn) since the server started",
        True,
        lambda s: s.departures_total,
    ),
    MetricSpec(
        "psyche_relay_bytes",
        "bytes the relay forwarded since the server started",
        True,
        lambda s: s.relay_bytes_total,
    ),
)


EVAL_METRICS: tuple[tuple[str, str, int], ...] = (
    (
        "psyche_eval",
        "an eval score (`eval`: lm-eval task and metric, or heldout_loss) at psyche_eval_step: "
        "the median over that step's witnesses",
        1,
    ),
    ("psyche_eval_step", "the step psyche_eval describes", 0),
)
"""(name, help, index into the snapshot's (step, value) pair) of the per-eval gauges."""


def eval_families(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    """`EVAL_METRICS` for every eval name the witnesses reported."""
    if not snapshot.evals:
        return
    for name, help_text, index in EVAL_METRICS:
        family = GaugeMetricFamily(name, help_text, labels=["run_id", "eval"])
        for eval_name, pair in snapshot.evals.items():
            family.add_metric([snapshot.run_id, eval_name], float(pair[index]))
        yield family


class SnapshotCollector(Collector):
    """The prometheus-client collector of `METRICS`, read from the board at each scrape."""

    def __init__(self, board: MetricsBoard) -> None:
        self.board = board

    def collect(self) -> Iterator[Metric]:
        snapshot = self.board.read()
        for spec in METRICS:
            value = spec.read(snapshot)
            if value is None:
                continue
            family: GaugeMetricFamily | CounterMetricFamily
            if spec.counter:
                family = CounterMetricFamily(spec.name, spec.help, labels=["run_id"])
            else:
                family = GaugeMetricFamily(spec.name, spec.help, labels=["run_id"])
            family.add_metric([snapshot.run_id], float(value))
            yield family
        yield from eval_families(snapshot)


class PrometheusExporter(MetricsHttpServer):
    """`/metrics` on `host:port` (port 0: a free one, read back from `port`)."""

    def __init__(self, board: MetricsBoard, host: str, port: int) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(board))
        super().__init__(registry, host, port)


class OtlpExporter:
    """The same figures pushed over OTLP/HTTP every `interval` seconds (the SDK's periodic
    reader; its thread does the exporting)."""

    def __init__(self, board: MetricsBoard, url: str, interval: float = 10.0) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.metrics import CallbackOptions, Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        self.url = url
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=url, timeout=10),
            export_interval_millis=interval * 1000,
            export_timeout_millis=10_000,
        )
        resource = Resource.create({"service.name": "psyche-server"})
        self.provider: MeterProvider = MeterProvider(resource=resource, metric_readers=[reader])
        meter = self.provider.get_meter("psyche_server")

        def callback(spec: MetricSpec) -> Callable[[CallbackOptions], list[Observation]]:
            def observe(_options: CallbackOptions) -> list[Observation]:
                snapshot = board.read()
                value = spec.read(snapshot)
                if value is None:
                    return []
                return [Observation(float(value), {"run_id": snapshot.run_id})]

            return observe

        def eval_callback(index: int) -> Callable[[CallbackOptions], list[Observation]]:
            def observe(_options: CallbackOptions) -> list[Observation]:
                snapshot = board.read()
                return [
                    Observation(float(pair[index]), {"run_id": snapshot.run_id, "eval": name})
                    for name, pair in snapshot.evals.items()
                ]

            return observe

        for name, help_text, index in EVAL_METRICS:
            meter.create_observable_gauge(name, [eval_callback(index)], description=help_text)
        for spec in METRICS:
            if spec.counter:
                meter.create_observable_counter(
                    f"{spec.name}_total", [callback(spec)], description=spec.help
                )
            else:
                meter.create_observable_gauge(spec.name, [callback(spec)], description=spec.help)

    def close(self) -> None:
        """Export once more and stop the reader thread."""
        try:
            self.provider.shutdown(timeout_millis=5_000)
        except Exception as exc:  # an unreachable collector must not stop the shutdown
            log.warning("OTLP metrics exporter did not shut down cleanly: %s", exc)
