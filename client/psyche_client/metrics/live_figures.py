"""The client's figures right now, as `--metrics-local-port` serves them (pure).

`live_figures(stats, traffic)` reads the client's statistics (`round.stats`) and its P2P node's
traffic counters (`p2p.stats`) into an immutable `LiveFigures`: plain numbers only, so the
HTTP server's thread can read it while the event loop goes on. A figure the client does not
have yet (no loss before its first trained step) is left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from psyche_client.p2p.stats import TransferStats
from psyche_client.round.stats import ClientStats


@dataclass(frozen=True)
class MetricSpec:
    name: str
    help: str
    counter: bool = False


SPECS: tuple[MetricSpec, ...] = (
    MetricSpec("psyche_client_step", "the coordinator's current step"),
    MetricSpec("psyche_client_epoch", "the coordinator's current epoch"),
    MetricSpec("psyche_client_loss", "mean loss of this client's batches at its last trained step"),
    MetricSpec(
        "psyche_client_tokens_per_second", "the run's training throughput over the last steps"
    ),
    MetricSpec("psyche_client_efficiency", "share of each step this client spent training"),
    MetricSpec("psyche_client_tokens", "tokens the run has trained on so far"),
    MetricSpec("psyche_client_round_seconds", "how long the last step lasted, as seen here"),
    MetricSpec("psyche_client_train_seconds", "how long training this client's batches took"),
    MetricSpec("psyche_client_p2p_sent_bytes", "bytes this client's P2P node sent", True),
    MetricSpec("psyche_client_p2p_received_bytes", "bytes this client's P2P node received", True),
    MetricSpec("psyche_client_results_announced", "results this client published", True),
    MetricSpec("psyche_client_results_downloaded", "peers' results downloaded", True),
    MetricSpec("psyche_client_resyncs", "times this client resynced its weights from peers", True),
)


@dataclass(frozen=True)
class LiveFigures:
    values: Mapping[str, float] = field(default_factory=dict)
    """By metric name (`SPECS`)."""
    run_state: str = ""
    evals: Mapping[str, float] = field(default_factory=dict)
    """The latest score of each eval (`--eval-*`)."""


def live_figures(stats: ClientStats, traffic: TransferStats) -> LiveFigures:
    values: dict[str, float | None] = {
        "psyche_client_step": stats.step,
        "psyche_client_epoch": stats.epoch,
        "psyche_client_loss": stats.last_loss,
        "psyche_client_tokens_per_second": stats.tokens_per_sec,
        "psyche_client_efficiency": stats.efficiency,
        "psyche_client_tokens": stats.total_tokens,
        "psyche_client_round_seconds": stats.step_durations[-1] if stats.step_durations else None,
        "psyche_client_train_seconds": (
            stats.train_durations[-1] if stats.train_durations else None
        ),
        "psyche_client_p2p_sent_bytes": traffic.total_sent,
        "psyche_client_p2p_received_bytes": traffic.total_received,
        "psyche_client_results_announced": stats.results_announced,
        "psyche_client_results_downloaded": stats.results_downloaded,
        "psyche_client_resyncs": stats.resyncs,
    }
    return LiveFigures(
        {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)},
        stats.run_state,
        {k: float(v) for k, v in stats.evals.items() if math.isfinite(v)},
    )
