"""Checkpoint switching (reference section 6): Hub→P2P at cooldown end, P2P→Hub when no
previous member is left, and checkpointers' `Checkpoint` messages.

The reference elects no checkpointers: any client started with an upload target is one, and
its coordinator accepts a `Checkpoint` from any epoch member, so any member could redirect
the run's persisted checkpoint. Here the checkpointers are the keys the operator names
(`psyche-server run --checkpointer KEY`); a `Checkpoint` from any other key is refused with
`NotCheckpointer`, and with no key named none is accepted.
"""

from __future__ import annotations

from collections.abc import Collection

from psyche_common.client_id import short_id
from psyche_common.config import (
    AnyCheckpoint,
    DummyCheckpoint,
    GcsCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
    P2PGcsCheckpoint,
)
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.state import CoordinatorState


def after_cooldown(checkpoint: AnyCheckpoint) -> AnyCheckpoint:
    """The epoch's members hold the model and can serve it: go P2P (at a successful cooldown
    end, and when a restart resumes from weights the members trained)."""
    if isinstance(checkpoint, HubCheckpoint | DummyCheckpoint):
        return P2PCheckpoint(repo_id=checkpoint.repo_id, revision=checkpoint.revision)
    if isinstance(checkpoint, GcsCheckpoint):
        return P2PGcsCheckpoint(bucket=checkpoint.bucket, prefix=checkpoint.prefix)
    return checkpoint


def without_peers(checkpoint: AnyCheckpoint) -> AnyCheckpoint:
    """No member of the previous epoch is back: nobody can serve P2P, use the stored repo."""
    if isinstance(checkpoint, P2PCheckpoint):
        return HubCheckpoint(repo_id=checkpoint.repo_id, revision=checkpoint.revision)
    if isinstance(checkpoint, P2PGcsCheckpoint):
        return GcsCheckpoint(bucket=checkpoint.bucket, prefix=checkpoint.prefix)
    return checkpoint


def merge_uploaded(current: AnyCheckpoint, received: AnyCheckpoint) -> AnyCheckpoint:
    """The checkpoint after a checkpointer reports an upload (unfitting variants: unchanged)."""
    if isinstance(received, HubCheckpoint):
        if current.is_p2p:
            return P2PCheckpoint(repo_id=received.repo_id, revision=received.revision)
        if isinstance(current, HubCheckpoint):
            return HubCheckpoint(repo_id=received.repo_id, revision=received.revision)
    elif isinstance(received, GcsCheckpoint):
        if current.is_p2p:
            return P2PGcsCheckpoint(bucket=received.bucket, prefix=received.prefix)
        if isinstance(current, GcsCheckpoint):
            return GcsCheckpoint(bucket=received.bucket, prefix=received.prefix)
    return current


def checkpoint_message(
    coord: CoordinatorState,
    from_id: bytes,
    index: int,
    checkpoint: AnyCheckpoint,
    checkpointers: Collection[bytes],
) -> None:
    """A checkpointer at `index` uploaded `checkpoint`; accepted in any run state, only from
    an epoch member whose key is one of `checkpointers`."""
    if from_id not in checkpointers:
        named = "no checkpointer is named" if not checkpointers else "it is not one of them"
        raise CoordinatorError(
            ErrorKind.NotCheckpointer,
            f"checkpoint from {short_id(from_id)} ignored: only the operator's checkpointers "
            f"(psyche-server run --checkpointer KEY) may set the run's checkpoint, and "
            f"{named}",
        )
    clients = coord.epoch_state.clients
    if not 0 <= index < len(clients) or clients[index].id != from_id:
        raise CoordinatorError(
            ErrorKind.InvalidCommitteeProof,
            f"checkpoint from {from_id[:4].hex()} does not match client index {index}",
        )
    coord.model.checkpoint = merge_uploaded(coord.model.checkpoint, checkpoint)
