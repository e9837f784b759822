"""`open_metrics_sink`: the sink `MetricsOptions` ask for (`app.parts.Parts.metrics`)."""

from __future__ import annotations

from psyche_client.metrics.options import MetricsOptions
from psyche_client.metrics.sink import ClientMetricsSink, NullSink


def open_metrics_sink(options: MetricsOptions, run_id: str, client: str) -> ClientMetricsSink:
    """A `WandbSink` with `--wandb-project`, else a `NullSink` (blocking: wandb starts here;
    raises `sink.MetricsStartError` when it cannot)."""
    if not options.wandb:
        return NullSink()
    from psyche_client.metrics.wandb_sink import WandbSink

    return WandbSink.open(options, run_id, client)
