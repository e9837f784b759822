"""Settings of a P2P node (bind address, chunking, timeouts, concurrency bounds, limits).

Defaults follow the reference where it has a number (§5): connect timeout 5 s, idle
connections kept 60 s, blob download deadline 600 s, model-sharing request timeout 10 s,
8 parameter downloads in flight, a model-sharing peer dropped after 5 errors.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class P2PConfig:
    """Settings of one `P2PNode`; every field has a default (see the module docstring)."""

    bind_host: str = "0.0.0.0"
    """Interface the listener binds ("0.0.0.0" = all IPv4 interfaces)."""
    port: int = 0
    """Listening port; 0 picks a free one (see `P2PNode.address`)."""
    advertise_host: str | None = None
    """Host put in `P2PNode.address` (what peers dial). None: the bind host, or this
    machine's primary IP when binding a wildcard address."""
    advertise_port: int | None = None
    """Port put in `P2PNode.address` (a port forward's outside port). None: the listening
    port."""

    chunk_size: int = 256 * KIB
    """Bytes per `Chunk` frame when serving a blob or parameter."""
    max_frame_size: int = 1 * MIB + 4 * KIB
    """Largest frame accepted from a peer (a chunk plus its msgpack envelope)."""
    max_blob_size: int = 1024 * MIB
    """Largest blob or parameter accepted from a peer."""
    max_manifest_size: int = 64 * MIB
    """Largest model manifest accepted (it may carry the tokenizer JSON)."""

    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    """Longest wait for any single frame (handshake step, header or chunk), and for a write
    to drain to a slow reader."""
    idle_timeout: float = 60.0
    """A link with no frame and no open stream for this long closes (unless kept open by an
    outbound-only node, which pings it); links idle for 5/6 of it are not reused."""
    announce_timeout: float = 5.0
    """Per-peer bound on pushing one announcement (connect + handshake + ack)."""
    fetch_deadline: float = 600.0
    """Overall bound on one blob fetch across every candidate and round."""
    min_blob_rate: float = 64 * KIB
    """Slowest average rate (bytes/s) at which one peer's answer to a blob request may arrive:
    it must be in within `read_timeout` + size / this of its header, else that peer counts as
    failed and the next candidate is asked. A member serving its result a byte at a time never
    trips `read_timeout` and would otherwise hold one of `max_concurrent_downloads` until
    `fetch_deadline`; a few such members held them all and starved honest results."""
    fetch_rounds: int = 2
    """Passes over the candidate list before a blob fetch gives up."""
    retry_backoff: float = 0.2
    """Pause before the second pass (doubling on later passes)."""

    max_concurrent_downloads: int = 8
    max_downloads_per_source: int = 2
    """Of those, at most this many of blobs whose first candidate (the announcer: the caller
    names it first) is one peer; its others wait, holding no shared slot. A trainer has one
    result a round, so an honest announcer rarely has two in flight; members whose blobs
    arrive slowly hold a bounded share, and the others' results keep being fetched."""
    max_concurrent_parameter_requests: int = 8
    max_connections: int = 1024
    """Peers with an open link at once (beyond it, dialing a new peer fails)."""
    max_inbound_connections: int = 256
    """Incoming connections open at once; more are closed at accept, before any handshake."""
    max_inbound_per_ip: int = 16
    """Incoming connections open at once from one IP address (a flood from one host cannot
    take every inbound slot; peers behind one NAT share an address, so not 1)."""
    max_concurrent_serving: int = 32
    """Blob, manifest and parameter requests served at once (others wait their turn)."""
    max_serving_per_peer: int = 4
    """Of those, at most this many blob requests of one peer, and as many of its manifest and
    parameter requests (its others wait, holding no shared slot): one member reading blobs
    slowly cannot hold every slot and keep a fresh result from being fetched, and a joiner's
    blob request does not wait behind its own model download."""
    announcement_rate: float = 64.0
    """New (not duplicate) announcements per second accepted from one pushing peer, after a
    burst of `announcement_burst`; more are answered "deferred" before any signature check.
    Each signer has the same budget for what other peers forward of it, charged once the
    signatures verified (a member's announcements relayed by honest peers are charged to the
    member, not to them)."""
    announcement_burst: int = 512
    link_frame_rate: float = 2048.0
    """Frames per second read from one link, after a burst of `link_frame_burst`: a link
    over it is not read (TCP holds its sender back) until its budget refills, so no member
    costs the event loop more than this many frame decodes per second (at the default 256 KiB
    chunks, 512 MiB/s per link)."""
    link_frame_burst: int = 512
    max_model_size: int = 64 * 1024 * MIB
    """Largest model (sum of its parameters' sizes) a late joiner accepts from peers."""
    max_result_size: int = 256 * MIB
    """Result announcements with a larger `size` are refused before any byte is fetched."""
    announce_wait: float = 1.0
    """Longest an `announce()` caller waits; pushes to slower peers go on in the background
    (each still bounded by `announce_timeout`)."""
    max_errors_per_peer: int = 5
    manifest_timeout: float = 10.0
    parameter_rounds: int = 3
    """Passes over the manifest holders for one parameter before the download fails."""
    max_seen_announcements: int = 100_000
    gossip_fanout: int = 8
    """How many random peers a node forwards each new announcement to (0: no forwarding)."""
    max_upload_rate: float | None = None
    """Bytes/s at which model shares (manifest and parameter answers to late joiners) are
    uploaded, over all peers together; None: no cap. Results are never capped."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"P2PConfig.port must be in [0, 65535], got {self.port}")
        if self.advertise_port is not None and not 0 < self.advertise_port < 65536:
            raise ValueError(
                f"P2PConfig.advertise_port must be in [1, 65535], got {self.advertise_port}"
            )
        if not 0 < self.chunk_size <= self.max_frame_size - 64:
            raise ValueError(
                f"P2PConfig.chunk_size ({self.chunk_size}) must be positive and at least 64 "
                f"bytes below max_frame_size ({self.max_frame_size})"
            )
        for name in (
            "max_concurrent_downloads",
            "max_downloads_per_source",
            "max_concurrent_parameter_requests",
            "max_connections",
            "max_inbound_connections",
            "max_inbound_per_ip",
            "max_concurrent_serving",
            "max_serving_per_peer",
            "announcement_burst",
            "link_frame_burst",
            "max_model_size",
            "max_result_size",
            "fetch_rounds",
            "parameter_rounds",
            "max_errors_per_peer",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"P2PConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.max_upload_rate is not None and self.max_upload_rate <= 0:
            raise ValueError(
                f"P2PConfig.max_upload_rate must be positive or None, got {self.max_upload_rate}"
            )
        for name in (
            "connect_timeout",
            "read_timeout",
            "idle_timeout",
            "fetch_deadline",
            "min_blob_rate",
            "announcement_rate",
            "link_frame_rate",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"P2PConfig.{name} must be positive, got {getattr(self, name)}")
