"""What `psyche-server run` can set (`ServerOptions`) and the counters a running server keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from psyche_common.protocol import Identity

from .admission import MAX_AUTHORIZATION_DAYS, MAX_DELEGATES_PER_AUTHORIZER
from .events_options import EventsOptions
from .limits import ConnectionLimits
from .relay_quota import RelayLimits


@dataclass
class ServerOptions:
    """Everything `psyche-server run` can set (defaults match the reference)."""

    host: str = "0.0.0.0"
    port: int = 0
    identity: Identity = field(default_factory=Identity.generate)
    """The server's ed25519 identity: it signs the handshake of every port (coordinator, data
    server, relay), so a client given `--server-key` knows it reached this server
    (`--identity-secret-key-path`; else a new one at every start)."""
    save_state_dir: Path | None = None
    init_warmup_time: int | None = None
    withdraw_on_disconnect: bool = True
    tick_interval: float = 0.5
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    data_host: str = "0.0.0.0"
    checkpointers: frozenset[bytes] = frozenset()
    """Keys whose `Checkpoint` messages may set the run's checkpoint (`--checkpointer`)."""
    relay: RelayLimits | None = field(default_factory=RelayLimits)
    """The relay's bounds (`--relay-max-mbps`); None: no relay (`--no-relay`)."""
    relay_port: int | None = None
    """The relay's own port; None (or the coordinator port): the relay shares the coordinator
    port, told apart by the handshake's domain."""
    authorized_keys: Path | None = None
    """`--authorized-keys`: only the keys listed there (and their delegates) may join; None:
    an open run."""
    max_delegates_per_authorizer: int = MAX_DELEGATES_PER_AUTHORIZER
    """`--max-delegates-per-authorizer`: delegates of one listed key admitted at a time."""
    max_authorization_days: float = MAX_AUTHORIZATION_DAYS
    """`--max-authorization-days`: the latest expiry of an accepted delegation, from now."""
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (`--metrics-port`; 0: a free one); None: off."""
    otlp_metrics_url: str | None = None
    """Push the same metrics over OTLP/HTTP to this URL (`--otlp-metrics-url`); None: off."""
    otlp_interval: float = 10.0
    """Seconds between two OTLP exports."""
    events: EventsOptions = field(default_factory=EventsOptions)
    """The run's event files (`--events-dir`, `--keep-event-files`; `run_events`)."""


@dataclass
class ServerStats:
    """Counters of a running server (shown by the dashboard, read by tests and benchmarks)."""

    ticks: int = 0
    broadcasts: int = 0
    last_broadcast_bytes: int = 0
    messages: int = 0
    message_ticks: int = 0
    """Ticks run after client messages (one per burst of ready messages)."""
    coordinator_errors: int = 0
    saved_states: list[Path] = field(default_factory=list)
