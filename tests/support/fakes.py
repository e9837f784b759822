"""In-memory stand-ins for the round pipeline's ports (`psyche_client.round.ports`).

`MemoryHub` is a peer network in one process: every client joins it and gets a
`MemoryNetwork` (the `PeerNetwork` port) that fans announcements out to the other members,
stores published blobs and fetches them from the named providers. `RecordingUplink` (the
`Uplink` port) records what a client sends to the server and can forward each message to a
`ServerSink` (a fake server). `unsigned_result` is a real `ResultAnnouncement` for tests that
never check signatures.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from psyche_client.p2p.announcements import (
    AnnouncementError,
    FinishedAnnouncement,
    ResultAnnouncement,
    message_id,
)
from psyche_client.p2p.inbox import VerifiedAnnouncement, verify
from psyche_common.announcements import ResultCommitment
from psyche_common.batch_id import BatchId
from psyche_common.config import HubCheckpoint
from psyche_common.coordinator import Witness
from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.protocol.messages import WitnessMetadata

Announcement = ResultAnnouncement | FinishedAnnouncement
Receiver = Callable[[VerifiedAnnouncement], None]
"""What a member does with an announcement a peer sent (a runner's `on_announcement`)."""


@dataclass
class MemoryHub:
    """The network all members share: who is listening, who holds which blob.

    Like the real P2P inbox, each receiver drops an announcement it has already seen (same
    `message_id`), so identical re-sent messages are delivered once, and one whose signatures
    do not verify; the others reach the receivers as `VerifiedAnnouncement`s. Members in `dead` send and
    serve nothing; members in `corrupt_from` serve damaged blobs.
    """

    receivers: dict[bytes, Receiver] = field(default_factory=dict)
    seen: dict[bytes, set[bytes]] = field(default_factory=dict)  # receiver -> delivered ids
    blobs: dict[bytes, dict[bytes, bytes]] = field(default_factory=dict)  # holder -> hash -> data
    corrupt_from: set[bytes] = field(default_factory=set)
    dead: set[bytes] = field(default_factory=set)
    corrupt_served: int = 0

    def join(self, me: bytes, receive: Receiver | None = None) -> MemoryNetwork:
        """`me`'s network; `receive` gets the peers' announcements (None: `me` only sends)."""
        self.blobs.setdefault(me, {})
        if receive is not None:
            self.receivers[me] = receive
        return MemoryNetwork(self, me)

    def listen(self, me: bytes, receive: Receiver) -> None:
        """`me` receives from now on (for a member whose receiver exists only after joining)."""
        self.receivers[me] = receive


@dataclass
class MemoryNetwork:
    """One member's view of a `MemoryHub`: implements the `PeerNetwork` port."""

    hub: MemoryHub
    me: bytes
    announced: list[Announcement] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)

    async def announce(self, announcement: Announcement) -> None:
        self.announced.append(announcement)
        if self.me in self.hub.dead:
            return
        key = message_id(announcement)
        try:
            verified = verify(announcement)
        except AnnouncementError:
            return
        for peer, receive in list(self.hub.receivers.items()):
            if peer == self.me or peer in self.hub.dead:
                continue
            seen = self.hub.seen.setdefault(peer, set())
            if key not in seen:
                seen.add(key)
                asyncio.get_running_loop().call_soon(receive, verified)

    def publish_blob(self, data: bytes, step: int) -> bytes:
        digest = hashlib.sha256(data).digest()
        self.hub.blobs[self.me][digest] = data
        return digest

    async def fetch_blob(self, blob_hash: bytes, size: int, providers: Sequence[bytes]) -> bytes:
        await asyncio.sleep(0)
        for peer in providers:
            if peer in self.hub.dead:
                continue
            data = self.hub.blobs.get(peer, {}).get(blob_hash)
            if data is None:
                continue
            if peer in self.hub.corrupt_from:
                self.hub.corrupt_served += 1
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            if hashlib.sha256(data).digest() == blob_hash:
                self.hub.blobs[self.me][blob_hash] = data
                return data
        raise ConnectionError(f"no provider holds blob {blob_hash.hex()[:8]}")

    def begin_step(self, step: int) -> None:
        self.steps.append(step)


def lone_network(me: bytes = bytes(32)) -> MemoryNetwork:
    """A network with no peers: announcements are recorded, every fetch fails."""
    return MemoryHub().join(me)


class ServerSink(Protocol):
    """A fake server behind `RecordingUplink`: gets each message once it is recorded."""

    def on_witness(self, sender: bytes, witness: Witness, metadata: WitnessMetadata) -> None: ...

    def on_warmup_witness(self, sender: bytes, witness: Witness) -> None: ...

    def on_health_check(
        self,
        sender: bytes,
        checks: Sequence[tuple[bytes, CommitteeProof]],
        step: int,
        weights_hash: bytes,
    ) -> None: ...

    def on_accusation(
        self,
        sender: bytes,
        step: int,
        trainer: bytes,
        batch: BatchId,
        agreement_milli: int,
        commitment: bytes | None,
    ) -> None: ...

    def on_attestation(
        self,
        sender: bytes,
        step: int,
        trainer: bytes,
        batch: BatchId,
        agreement_milli: int,
        commitment: bytes,
    ) -> None: ...

    def on_equivocation(self, sender: bytes, proof: EquivocationProof) -> None: ...

    def on_join(self, sender: bytes) -> None: ...


@dataclass
class RecordingUplink:
    """Implements the `Uplink` port: records every message, in the order sent, by kind, and
    passes it on to `server` when one is attached."""

    me: bytes = bytes(32)
    server: ServerSink | None = None
    witnesses: list[tuple[Witness, WitnessMetadata]] = field(default_factory=list)
    warmup_witnesses: list[Witness] = field(default_factory=list)
    health: list[tuple[list[tuple[bytes, CommitteeProof]], int, bytes]] = field(
        default_factory=list
    )
    checkpoints: list[HubCheckpoint] = field(default_factory=list)
    accusations: list[tuple[int, bytes, BatchId, int]] = field(default_factory=list)
    equivocations: list[EquivocationProof] = field(default_factory=list)
    attestations: list[tuple[int, bytes, BatchId, int, bytes]] = field(default_factory=list)
    joins: int = 0

    async def send_witness(self, witness: Witness, metadata: WitnessMetadata) -> None:
        self.witnesses.append((witness, metadata))
        if self.server is not None:
            self.server.on_witness(self.me, witness, metadata)

    async def send_warmup_witness(self, witness: Witness) -> None:
        self.warmup_witnesses.append(witness)
        if self.server is not None:
            self.server.on_warmup_witness(self.me, witness)

    async def send_health_check(
        self, checks: Sequence[tuple[bytes, CommitteeProof]], step: int, weights_hash: bytes
    ) -> None:
        self.health.append((list(checks), step, weights_hash))
        if self.server is not None:
            self.server.on_health_check(self.me, checks, step, weights_hash)

    async def send_checkpoint(self, checkpoint: HubCheckpoint) -> None:
        self.checkpoints.append(checkpoint)

    async def send_join(self) -> None:
        self.joins += 1
        if self.server is not None:
            self.server.on_join(self.me)

    async def send_accusation(
        self,
        step: int,
        trainer: bytes,
        batch: BatchId,
        agreement_milli: int,
        commitment: bytes | None = None,
    ) -> None:
        self.accusations.append((step, trainer, batch, agreement_milli))
        if self.server is not None:
            self.server.on_accusation(self.me, step, trainer, batch, agreement_milli, commitment)

    async def send_attestation(
        self, step: int, trainer: bytes, batch: BatchId, agreement_milli: int, commitment: bytes
    ) -> None:
        self.attestations.append((step, trainer, batch, agreement_milli, commitment))
        if self.server is not None:
            self.server.on_attestation(self.me, step, trainer, batch, agreement_milli, commitment)

    async def send_equivocation(self, proof: EquivocationProof) -> None:
        self.equivocations.append(proof)
        if self.server is not None:
            self.server.on_equivocation(self.me, proof)


def unsigned_result(
    sender_id: bytes, batch: BatchId, data_hash: bytes, *, size: int = 0, step: int = 0
) -> ResultAnnouncement:
    """A result announcement with empty signatures (for parts that never verify one), for run
    "test" (`tests.support.coordinators`) and round seed 0."""
    commitment = ResultCommitment(
        "test", 0, sender_id, step, batch, data_hash, bytes(32), size, b""
    )
    return ResultAnnouncement(commitment)
