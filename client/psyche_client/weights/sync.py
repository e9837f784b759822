"""Keeping a client's weights equal to the majority's: the check at every Warmup.

A client that was dropped, lost its links, missed a result the witnesses approved, or whose
process outlived a server restart may hold weights that differ from its peers'. At every
Warmup of a run whose checkpoint is peer-to-peer, each member serves its current weights
(`SharedModel`, rebuilt only when the weights changed since it was last built) and compares
them with the other members': when a strict majority of the epoch's members (itself counted)
agrees on weights that are not its own, it downloads them parameter by parameter,
hash-checked against that majority's manifest, and loads them; its DisTrO momentum restarts
from zero (`TrainingBackend.load_parameters`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from psyche_common.client_id import short_id
from psyche_common.coordinator import Coordinator
from psyche_common.retry import call, polling
from psyche_common.votes import voter_weights

from psyche_client.p2p.fetch import TRANSIENT_ERRORS
from psyche_client.p2p.manifest import ManifestError, ModelManifest
from psyche_client.p2p.model_share import ManifestVote, download_model, request_manifest
from psyche_client.p2p.node import P2PNode
from psyche_client.p2p.transfer import NotHeld
from psyche_client.training.backend import TrainingBackend
from psyche_client.weights.sharing import SharedModel

log = logging.getLogger("psyche.client")

POLL_INTERVAL = 1.0
"""Seconds between manifest polls while the members' majority is not yet clear."""


@dataclass(frozen=True)
class SyncOutcome:
    """What the Warmup check found: in sync, resynced from peers, or undecided."""

    status: str  # "in sync" | "resynced" | "undecided"
    agreeing: int
    members: int


def majority_weights(
    mine: bytes,
    answers: dict[bytes, ModelManifest],
    members: Sequence[bytes],
    me: bytes,
    authorizers: Mapping[bytes, bytes] | None = None,
) -> tuple[bytes, list[bytes]] | None:
    """(weights digest, peers holding it) that a strict majority of the `members`' voters
    holds (our own weights, `me`'s, vote for `mine`; in a permissioned run a listed key and
    its delegates, `authorizers`, share one vote: `psyche_common.votes`), or None when no
    weights have a majority yet."""
    weights, voters = voter_weights(members, authorizers or {})
    own = weights.get(me, Fraction(1))
    votes: dict[bytes, list[bytes]] = {}
    for peer, manifest in answers.items():
        votes.setdefault(manifest.weights_digest(), []).append(peer)
    for digest, holders in votes.items():
        held = sum((weights.get(peer, Fraction(1)) for peer in holders), Fraction(0))
        if 2 * (held + (own if digest == mine else 0)) > voters:
            return digest, holders
    if len(members) <= 1:  # alone in the epoch
        return mine, []
    return None


class WeightsSync:
    def __init__(self, node: P2PNode, shared: SharedModel, wait: float = 20.0) -> None:
        self.node = node
        self.shared = shared
        self.wait = wait

    async def serve_current(self, backend: TrainingBackend, coordinator: Coordinator) -> bytes:
        """Serve our current weights (rebuilt only if they changed); their weights digest."""
        if not self.shared.holds(backend):
            await self.shared.share(backend, coordinator.progress.step, coordinator.progress.epoch)
        assert self.shared.manifest is not None
        return self.shared.manifest.weights_digest()

    async def check(
        self, backend: TrainingBackend, coordinator: Coordinator, members: Sequence[bytes]
    ) -> SyncOutcome:
        """Compare our weights with the members' majority; fetch and load theirs if ours
        differ. Gives up (undecided) after `wait` seconds without a majority."""
        mine = await self.serve_current(backend, coordinator)
        peers = [member for member in members if member != self.node.peer_id]

        async def ask() -> tuple[dict[bytes, ModelManifest], tuple[bytes, list[bytes]] | None]:
            answers = await self._manifests(peers)
            return answers, majority_weights(
                mine, answers, members, self.node.peer_id, self.node.authorizers
            )

        answers, found = await call(
            polling(lambda poll: poll[1] is not None, POLL_INTERVAL, self.wait), ask
        )
        if found is None:
            return SyncOutcome("undecided", 0, len(members))
        digest, holders = found
        if digest == mine:
            return SyncOutcome("in sync", len(holders) + 1, len(members))
        await self._download(backend, coordinator, answers, holders)
        return SyncOutcome("resynced", len(holders), len(members))

    async def _manifests(self, peers: Sequence[bytes]) -> dict[bytes, ModelManifest]:
        answers: dict[bytes, ModelManifest] = {}

        async def ask(peer: bytes) -> None:
            try:
                async with asyncio.timeout(self.node.config.manifest_timeout):
                    answers[peer] = await request_manifest(self.node, peer)
            except (NotHeld, ManifestError, *TRANSIENT_ERRORS) as exc:
                log.debug("no manifest from %s: %s", short_id(peer), exc)

        async with asyncio.TaskGroup() as group:
            for peer in peers:
                group.create_task(ask(peer))
        return answers

    async def _download(
        self,
        backend: TrainingBackend,
        coordinator: Coordinator,
        answers: dict[bytes, ModelManifest],
        holders: list[bytes],
    ) -> None:
        vote = ManifestVote(answers[holders[0]], holders, len(answers))
        download = await download_model(self.node, holders, vote=vote)
        await asyncio.to_thread(backend.load_parameters, download.parameters)
        await self.serve_current(backend, coordinator)
