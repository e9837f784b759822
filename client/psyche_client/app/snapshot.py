"""`ClientSnapshot`: a frozen, typed view of a running client, taken by the app for the
dashboard (`tui/` reads only this, never the app's parts).

`take_snapshot` reads the parts it is given (statistics, P2P node, round pipeline, server
session, model lifecycle) at one instant and copies out plain values.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from psyche_common.coordinator import Coordinator
from psyche_common.protocol.messages import Reachability

from psyche_client.p2p.node import P2PNode
from psyche_client.round.runner import RoundRunner
from psyche_client.round.stats import ClientStats
from psyche_client.session.reconnect import SessionStatus

LOSSES_SHOWN = 200


@dataclass(frozen=True)
class PeerSnapshot:
    id: bytes
    address: str
    latency: float | None
    bytes_received: int
    bytes_sent: int
    reachable: bool
    link: str
    """The connection in use: "we dialed", "they dialed", or "none"."""


@dataclass(frozen=True)
class RoundSnapshot:
    """This client's part in the current round."""

    batches_left: int
    my_batches: tuple[str, ...]
    is_trainer: bool
    is_witness: bool


@dataclass(frozen=True)
class TransferSnapshot:
    """A download in flight: a peer's result, or the model's parameters."""

    label: str
    done: int
    total: int


@dataclass(frozen=True)
class ClientSnapshot:
    client_id: bytes
    coordinator: Coordinator | None
    """The latest coordinator state (None before the first)."""
    round: RoundSnapshot | None
    epoch: int
    step: int
    losses: tuple[tuple[int, float], ...]
    last_loss: float | None
    tokens_per_sec: float
    efficiency: float
    global_batch_tokens: int
    total_tokens: int
    weights_hash: bytes
    """Of the latest step this client holds weights of (empty before any)."""
    sync_status: str
    last_checkpoint: str
    checkpoint_error: str | None
    evals: tuple[tuple[str, int, float], ...]
    """(name, step, score) of the latest eval scores (`--eval-*`), by name."""
    link_status: str
    bytes_up_step: int
    bytes_down_step: int
    total_received: int
    corrupt_blobs: int
    peers: tuple[PeerSnapshot, ...]
    transfers: tuple[TransferSnapshot, ...]
    server_away: str | None
    """How reconnecting goes while the server connection is lost (None: connected, or never
    was)."""
    reachability: Reachability | None
    """The server's last verdict on our P2P address (None until its probe ends)."""


def take_snapshot(
    client_id: bytes,
    coordinator: Coordinator | None,
    runner: RoundRunner | None,
    stats: ClientStats,
    node: P2PNode,
    peer_addresses: Mapping[bytes, str],
    session: SessionStatus,
    reachability: Reachability | None,
    model_download: tuple[int, int] | None,
) -> ClientSnapshot:
    traffic = node.stats.current()
    current = runner.current if runner is not None else None
    round_ = None
    if current is not None:
        roles = current.roles
        round_ = RoundSnapshot(
            current.batches_left,
            tuple(str(b) for b in roles.my_batches),
            roles.is_trainer,
            roles.is_witness,
        )
    peers = []
    for peer_id in node.known_peers():
        peer_stats = node.stats.peers.get(peer_id)
        peers.append(
            PeerSnapshot(
                peer_id,
                peer_addresses.get(peer_id, "?"),
                node.health.latency.get(peer_id),
                peer_stats.bytes_received if peer_stats else 0,
                peer_stats.bytes_sent if peer_stats else 0,
                node.is_reachable(peer_id),
                node.link_state(peer_id),
            )
        )
    transfers = []
    for candidate in (runner.previous, current) if runner is not None else ():
        if candidate is None:
            continue
        for data_hash, download in candidate.downloads.items():
            if not download.settled:
                size = download.announcement.size
                transfers.append(TransferSnapshot(f"result {data_hash.hex()[:12]}", 0, size))
    if model_download is not None:
        done, total = model_download
        if done < total:
            transfers.append(TransferSnapshot("model parameters", done, total))
    away = None
    if not session.connected and session.lost_at is not None:
        away = session.describe(time.monotonic())
    hashes = stats.weights_hashes
    return ClientSnapshot(
        client_id=client_id,
        coordinator=coordinator,
        round=round_,
        epoch=stats.epoch,
        step=stats.step,
        losses=tuple(stats.losses[-LOSSES_SHOWN:]),
        last_loss=stats.last_loss,
        tokens_per_sec=stats.tokens_per_sec,
        efficiency=stats.efficiency,
        global_batch_tokens=stats.global_batch_tokens,
        total_tokens=stats.total_tokens,
        weights_hash=hashes[max(hashes)] if hashes else b"",
        sync_status=stats.sync_status,
        last_checkpoint=stats.last_checkpoint,
        checkpoint_error=stats.checkpoint_error,
        evals=tuple(
            (name, stats.eval_steps[name], value) for name, value in sorted(stats.evals.items())
        ),
        link_status=stats.link_status,
        bytes_up_step=traffic.bytes_sent,
        bytes_down_step=traffic.bytes_received,
        total_received=node.stats.total_received,
        corrupt_blobs=node.stats.downloads.corrupt,
        peers=tuple(peers),
        transfers=tuple(transfers),
        server_away=away,
        reachability=reachability,
    )
