"""In-memory content-addressed blob store (the reference's iroh-blobs store, simplified).

A blob is addressed by the SHA-256 of its bytes. A node serves every blob in its store to any
member peer, so a peer that downloaded and verified a result re-serves it. Each blob may carry
the training `step` it belongs to; `prune_before(step)` drops old steps the way the reference
deletes `distro-result_{step}` tags older than `step − 2`. Blobs without a step stay until
`remove`d.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass


def blob_hash(data: bytes | bytearray | memoryview) -> bytes:
    """The content address of `data`: its SHA-256 digest (32 bytes)."""
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class StoredBlob:
    """A blob's bytes and the training step it belongs to (None: kept until removed)."""

    data: bytes
    step: int | None


class BlobStore:
    """Blobs by SHA-256; not thread-safe (use it from the event loop)."""

    def __init__(self) -> None:
        self._blobs: dict[bytes, StoredBlob] = {}

    def put(self, data: bytes, *, step: int | None = None) -> bytes:
        """Store `data` (hashing it) and return its hash. Re-adding keeps the newest step."""
        digest = blob_hash(data)
        self._insert(digest, bytes(data), step)
        return digest

    def put_verified(self, digest: bytes, data: bytes, *, step: int | None = None) -> None:
        """Store bytes whose SHA-256 the caller has just checked equals `digest`."""
        self._insert(digest, data, step)

    def _insert(self, digest: bytes, data: bytes, step: int | None) -> None:
        existing = self._blobs.get(digest)
        if existing is not None and existing.step is not None and step is not None:
            step = max(step, existing.step)
        elif existing is not None and step is None:
            step = existing.step
        self._blobs[digest] = StoredBlob(data, step)

    def get(self, digest: bytes) -> bytes | None:
        stored = self._blobs.get(digest)
        return None if stored is None else stored.data

    def __contains__(self, digest: object) -> bool:
        return digest in self._blobs

    def __len__(self) -> int:
        return len(self._blobs)

    def hashes(self) -> Iterator[bytes]:
        return iter(list(self._blobs))

    @property
    def total_bytes(self) -> int:
        return sum(len(b.data) for b in self._blobs.values())

    def remove(self, digest: bytes) -> bool:
        return self._blobs.pop(digest, None) is not None

    def prune_before(self, min_step: int) -> int:
        """Drop blobs tagged with a step `< min_step`; returns how many were dropped."""
        old = [h for h, b in self._blobs.items() if b.step is not None and b.step < min_step]
        for digest in old:
            del self._blobs[digest]
        return len(old)
