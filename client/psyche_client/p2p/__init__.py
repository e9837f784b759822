"""Peer-to-peer layer of the client: plain asyncio streams between epoch members.

- `node.P2PNode`: listener + links; announce, serve and fetch blobs, serve the model
  (`serving`: answering peers' requests; `outbound`: outbound-only nodes, link catch-up).
- `link.PeerLink` / `links.LinkTable`: one authenticated connection per peer pair, carrying
  request streams both ways, whoever dialed it.
- `recent`: the announcements of recent steps, pushed to a peer whose link comes up.
- `pacing`: a round's frames before model shares (priority writer lock, bulk-upload shaper
  with the optional `max_upload_rate` cap, a short kernel send queue).
- `announcements`: signing and verifying the `ResultAnnouncement` / `FinishedAnnouncement`
  messages (their types and wire form: `psyche_common.announcements`).
- `blobs.BlobStore`: content-addressed (SHA-256) in-memory store of served blobs.
- `fetch`: candidate ordering, timeouts, retries and hash checks of downloads.
- `manifest` / `model_share`: late-joiner parameter download with a majority-agreed manifest.
- `stats.TransferStats`: bytes up/down per step and per peer, download counters.
- `benchmark`: P2P parameter fetch vs. a raw loopback socket copy.

See docs/p2p.md for the wire protocol.
"""

from .announcements import (
    Announcement,
    AnnouncementError,
    FinishedAnnouncement,
    ResultAnnouncement,
    make_finished_announcement,
    make_result_announcement,
    verify_announcement,
)
from .blobs import BlobStore, blob_hash
from .config import P2PConfig
from .connection import PeerRefused, PeerUnavailable
from .fetch import FetchError, FetchFailure
from .manifest import ManifestError, ModelManifest, ParameterInfo, parameter_info
from .model_share import ModelDownload, ModelShareError, download_model, poll_manifests
from .node import P2PNode
from .pushing import AnnounceReport
from .stats import TransferStats

__all__ = [
    "AnnounceReport",
    "Announcement",
    "AnnouncementError",
    "BlobStore",
    "FetchError",
    "FetchFailure",
    "FinishedAnnouncement",
    "ManifestError",
    "ModelDownload",
    "ModelManifest",
    "ModelShareError",
    "P2PConfig",
    "P2PNode",
    "ParameterInfo",
    "PeerRefused",
    "PeerUnavailable",
    "ResultAnnouncement",
    "TransferStats",
    "blob_hash",
    "download_model",
    "make_finished_announcement",
    "make_result_announcement",
    "parameter_info",
    "poll_manifests",
    "verify_announcement",
]
