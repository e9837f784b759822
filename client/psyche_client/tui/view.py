"""What the dashboard shows, as plain values (no Textual imports here).

`build_view(snapshot, bandwidth)` turns the app's `ClientSnapshot` into the strings and rows
the dashboard renders. Tests build a `ClientView` directly.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from psyche_common.coordinator import Coordinator
from psyche_common.protocol import short_id
from psyche_common.protocol.messages import Reachability

from psyche_client.app.snapshot import ClientSnapshot, RoundSnapshot
from psyche_client.units import format_bytes as format_bytes  # re-exported for the dashboard


@dataclass(frozen=True)
class DownloadRow:
    label: str
    done: int
    total: int


RELAYED = " (relayed)"
"""The suffix of a link through the server's relay (`P2PNode.link_state`)."""


@dataclass(frozen=True)
class PeerRow:
    short_id: str
    address: str
    latency: float | None
    bytes_received: int
    bytes_sent: int
    reachable: bool = True
    """False: the peer accepts no connections (outbound-only; the server's check)."""
    link: str = ""
    """The connection in use: "we dialed", "they dialed" (either with " (relayed)" for a pipe
    through the server's relay), or "none"."""


@dataclass(frozen=True)
class ClientView:
    client_id: str = ""
    run_state: str = "Connecting"
    status: str = "Connecting"
    epoch: int = 0
    step: int = 0
    height: int = 0
    losses: tuple[tuple[int, float], ...] = ()
    last_loss: float | None = None
    tokens_per_sec: float = 0.0
    efficiency: float = 0.0
    global_batch_tokens: int = 0
    total_tokens: int = 0
    my_batches: tuple[str, ...] = ()
    batches_left: int = 0
    role: str = "-"
    weights_hash: str = ""
    sync_status: str = "in sync"
    bytes_up_step: int = 0
    bytes_down_step: int = 0
    clients: tuple[str, ...] = ()
    data_source: str = ""
    checkpoint: str = ""
    peers: tuple[PeerRow, ...] = ()
    reachability: str = "not checked yet"
    """Whether peers can connect to this client (the server's check of its P2P address)."""
    downloads: tuple[DownloadRow, ...] = ()
    bandwidth: tuple[float, ...] = ()
    corrupt_blobs: int = 0
    last_checkpoint: str = ""
    checkpoint_error: str = ""
    link_status: str = ""
    evals: tuple[str, ...] = ()
    """`name: score (step N)` of each latest eval score."""


@dataclass
class BandwidthMeter:
    """Download bytes/s sampled once a second, last 60 samples."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=60))
    _last_total: int | None = None
    _last_time: float | None = None

    def sample(self, total_received: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._last_total is not None and self._last_time is not None:
            elapsed = now - self._last_time
            if elapsed < 1.0:
                return
            self.samples.append(max(0, total_received - self._last_total) / elapsed)
        self._last_total = total_received
        self._last_time = now


def format_count(value: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "B", "T"):
        if abs(value) < 1000 or suffix == "T":
            text = f"{value:.0f}" if suffix == "" else f"{value:.1f}{suffix}"
            return f"{text}{unit}"
        value /= 1000
    return f"{value}{unit}"


def _role(round_: RoundSnapshot | None) -> str:
    if round_ is None:
        return "-"
    parts = ["Trainer" if round_.is_trainer else "Idle"]
    if round_.is_witness:
        parts.append("Witness")
    return " + ".join(parts)


def run_state_text(coordinator: Coordinator, now: int) -> str:
    """The reference's "Run state" box: `Waiting for N members`, `Warmup (Xs remaining)`,
    `Training`, `Witnessing`, `Cooldown (Xs remaining)`, `Finished`, `Paused`."""
    name = str(coordinator.run_state)
    elapsed = now - coordinator.run_state_start_unix_timestamp
    config = coordinator.config
    if name == "WaitingForMembers":
        missing = max(0, config.min_clients - len(coordinator.epoch_state.clients))
        return f"Waiting for {missing} members"
    if name == "Warmup":
        return f"Warmup ({max(0, config.warmup_time - elapsed)}s remaining)"
    if name == "Cooldown":
        return f"Cooldown ({max(0, config.cooldown_time - elapsed)}s remaining)"
    return {"RoundTrain": "Training", "RoundWitness": "Witnessing"}.get(name, name)


def build_view(snapshot: ClientSnapshot, bandwidth: BandwidthMeter) -> ClientView:
    """The dashboard's values for one snapshot of the client."""
    coordinator = snapshot.coordinator
    round_ = snapshot.round
    bandwidth.sample(snapshot.total_received)
    state = str(coordinator.run_state) if coordinator is not None else "Connecting"
    status = state
    if coordinator is not None and state == "RoundTrain" and round_ is not None:
        status = f"Training ({round_.batches_left} batches left)"
    if snapshot.server_away is not None:
        status = "Server " + snapshot.server_away
    peers = tuple(
        PeerRow(
            short_id(peer.id),
            peer.address,
            peer.latency,
            peer.bytes_received,
            peer.bytes_sent,
            peer.reachable,
            peer.link,
        )
        for peer in snapshot.peers
    )
    downloads = tuple(DownloadRow(t.label, t.done, t.total) for t in snapshot.transfers)
    clients: tuple[str, ...] = ()
    data_source = checkpoint = ""
    height = 0
    if coordinator is not None:
        state = run_state_text(coordinator, int(time.time()))
        clients = tuple(short_id(c.id) for c in coordinator.epoch_state.clients)
        data_source = str(coordinator.model.data_location)
        checkpoint = str(coordinator.model.checkpoint)
        height = coordinator.current_round().height
    return ClientView(
        client_id=short_id(snapshot.client_id),
        run_state=state,
        status=status,
        epoch=snapshot.epoch,
        step=snapshot.step,
        height=height,
        losses=snapshot.losses,
        last_loss=snapshot.last_loss,
        tokens_per_sec=snapshot.tokens_per_sec,
        efficiency=snapshot.efficiency,
        global_batch_tokens=snapshot.global_batch_tokens,
        total_tokens=snapshot.total_tokens,
        my_batches=round_.my_batches if round_ else (),
        batches_left=round_.batches_left if round_ else 0,
        role=_role(round_),
        weights_hash=snapshot.weights_hash.hex()[:16],
        sync_status=snapshot.sync_status,
        bytes_up_step=snapshot.bytes_up_step,
        bytes_down_step=snapshot.bytes_down_step,
        clients=clients,
        data_source=data_source,
        checkpoint=checkpoint,
        peers=peers,
        reachability=_reachability(snapshot.reachability),
        downloads=downloads,
        bandwidth=tuple(bandwidth.samples),
        corrupt_blobs=snapshot.corrupt_blobs,
        last_checkpoint=snapshot.last_checkpoint,
        checkpoint_error=snapshot.checkpoint_error or "",
        link_status=snapshot.link_status,
        evals=tuple(f"{name}: {value:.4f} (step {step})" for name, step, value in snapshot.evals),
    )


def _reachability(notice: Reachability | None) -> str:
    """The server's verdict on our P2P address (a `Reachability` message, or None)."""
    if notice is None:
        return "not checked yet"
    if notice.reachable:
        return f"reachable at {notice.p2p_address} (seen from {notice.observed_host})"
    return (
        f"outbound only: NOT reachable at {notice.p2p_address} (seen from "
        f"{notice.observed_host}); connects to its peers itself"
    )
