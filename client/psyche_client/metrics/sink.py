"""`ClientMetricsSink`: where a client's metrics go, one step at a time; `NullSink` drops them.

A sink receives plain `name -> value` mappings for a step (the per-step figures of
`step_values`, and extras such as optimizer statistics or `eval/<task>` scores) and must
never block the caller nor raise: the round pipeline's event loop calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class MetricsStartError(RuntimeError):
    """The metrics system cannot start (e.g. wandb online without credentials)."""


class ClientMetricsSink(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Record `values` for `step` (quick, never raises)."""
        ...

    def close(self) -> None:
        """Flush and release (may block: called once, off the event loop)."""
        ...


class NullSink:
    """The sink of a client without a metrics system: drops everything."""

    def log(self, step: int, values: Mapping[str, float]) -> None:
        return None

    def close(self) -> None:
        return None


class FanoutSink:
    """Hands every step to each of `sinks` (the metrics system's and the event files')."""

    def __init__(self, *sinks: ClientMetricsSink) -> None:
        self.sinks = sinks

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, values)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
