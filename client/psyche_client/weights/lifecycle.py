"""`ModelLifecycle`: the client's model from its first Warmup to every Cooldown.

It implements three of the round pipeline's ports (`round.ports`): the backend loader (build
the backend the options select from `weights.backends`, with the weights from the checkpoint's
repository, or from peers once the run's checkpoint is peer-to-peer), the Warmup weights check
(`weights.sync`) and the Cooldown hook (share the weights with late joiners, save and upload
the checkpoint: `weights.sharing`). It also holds what the P2P node serves to joiners
(`shared`) and the progress of a model download, for the dashboard.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from pathlib import Path

from psyche_common.client_id import short_id
from psyche_common.config import HubCheckpoint
from psyche_common.coordinator import Coordinator
from psyche_common.model_source import SourceKind, classify_source
from psyche_common.progress import TransferProgress, report_progress
from psyche_common.protocol import Identity

from psyche_client.p2p.manifest import ParameterInfo
from psyche_client.p2p.model_share import (
    JOINER_WAIT,
    SNAPSHOT_POLL_INTERVAL,
    ManifestVote,
    ModelShareError,
    download_model,
    poll_manifests,
)
from psyche_client.p2p.node import P2PNode
from psyche_client.round.ports import ModelUnavailable, Uplink
from psyche_client.round.stats import ClientStats
from psyche_client.training.backend import TrainingBackend
from psyche_client.weights.backends import (
    BACKENDS,
    BackendEntry,
    BackendKind,
    BackendOptions,
    PeerConfig,
)
from psyche_client.weights.sharing import SharedModel, checkpoint_model
from psyche_client.weights.sync import WeightsSync

log = logging.getLogger("psyche.client")


@dataclass(frozen=True)
class CheckpointOptions:
    """Where each Cooldown's checkpoint goes: `dir/{run_id}-step{N}` (None: not saved), each
    also uploaded to the Hub repo `hub_repo` if given; with `delete_old_steps` only the newest
    `keep` of the run are kept (`--keep-steps`, `--delete-old-steps`)."""

    dir: Path | None = None
    hub_repo: str | None = None
    keep: int = 3
    delete_old_steps: bool = True

    @property
    def retained(self) -> int | None:
        """How many checkpoints are kept (None: all)."""
        return self.keep if self.delete_old_steps else None


class ModelLifecycle:
    """Loads, checks, shares and saves this client's model (see the module docstring)."""

    def __init__(
        self,
        node: P2PNode,
        identity: Identity,
        run_id: str,
        members: Callable[[], Set[bytes]],
        backend: BackendOptions,
        checkpointing: CheckpointOptions,
        stats: ClientStats,
        uplink: Uplink,
        backends: Mapping[BackendKind, BackendEntry] = BACKENDS,
    ) -> None:
        self.node = node
        self.identity = identity
        self.run_id = run_id
        self.members = members
        """The current epoch's members (from the latest coordinator state)."""
        self.backend_options = backend
        self.checkpointing = checkpointing
        self.stats = stats
        self.uplink = uplink
        self.backends = backends
        self.shared = SharedModel()
        """What the P2P node serves to late joiners."""
        self.download_progress: tuple[int, int] | None = None
        """(parameters fetched, total) of the model download from peers, once one started."""

    # ------------------------------------------------------------------ loader port

    async def load_backend(self, coordinator: Coordinator) -> TrainingBackend:
        me = self.identity.public_key
        peers = [peer for peer in self.members() if peer != me]
        from_peers = coordinator.model.checkpoint.is_p2p
        if from_peers and not peers:
            # the coordinator keeps a peer-to-peer checkpoint only while a member holding the
            # weights is back; it may not be in our latest state yet (or has just left: the
            # next Warmup then falls back to the stored checkpoint)
            raise ModelUnavailable(
                "the run's weights are peer-to-peer and no other member is known"
            )
        try:
            return await self._load(coordinator, peers, from_peers)
        except ModelShareError as exc:
            raise ModelUnavailable(f"fetching it from {len(peers)} peer(s): {exc}") from exc

    async def _load(
        self, coordinator: Coordinator, peers: list[bytes], from_peers: bool
    ) -> TrainingBackend:
        entry = self.backends[self.backend_options.kind]
        # one manifest poll decides both the config and the weights: several peers must
        # vouch for it (`model_share.choose_manifest`); peers that share no model yet, or
        # disagree, are given time (after a server restart mid-epoch the members share theirs
        # only once their Warmup weights check has run)
        vote = await poll_manifests(self.node, peers, wait=JOINER_WAIT) if from_peers else None
        if entry.builds_model:
            if not from_peers:
                await asyncio.to_thread(self._fetch_hub_model, coordinator)
            peer_config = None if vote is None else _peer_config(vote)
            backend = await asyncio.to_thread(
                entry.load, coordinator, self.backend_options, peer_config, from_peers
            )
        else:
            backend = entry.load(coordinator, self.backend_options, None, from_peers)
        if vote is not None:
            await self._download_from_peers(backend, peers, vote)
        return backend

    def _fetch_hub_model(self, coordinator: Coordinator) -> None:
        """A Hub repo checkpoint's files into the Hugging Face cache, with at most
        `--hub-max-concurrent-downloads` at once, before the backend loads from it (blocking:
        run in a thread). Local directories and `builtin:` presets fetch nothing."""
        repo = coordinator.model.checkpoint.hub_repo()
        if repo is None or classify_source(repo.repo_id) != SourceKind.HUB:
            return
        from psyche_client.training.model.loading import download_hub_model

        workers = self.backend_options.hub_max_concurrent_downloads
        log.info(
            "downloading %s from the Hugging Face Hub (%d files at once)", repo.repo_id, workers
        )
        download_hub_model(repo.repo_id, repo.revision, workers)

    async def _download_from_peers(
        self, backend: TrainingBackend, peers: list[bytes], vote: ManifestVote
    ) -> None:
        log.info("fetching the model from %d peer(s)", len(vote.holders))
        received = 0

        def arrived(info: ParameterInfo, data: bytes) -> None:
            nonlocal received
            received += len(data)

        def progress(done: int, total: int) -> None:
            self.download_progress = (done, total)

        download = await report_progress(
            TransferProgress(
                "fetching the model from peers",
                vote.manifest.total_bytes,
                log,
                fields={"client_id": self.identity.short_id},
            ),
            lambda: received,
            download_model(self.node, peers, on_parameter=arrived, on_progress=progress, vote=vote),
        )
        await asyncio.to_thread(backend.load_parameters, download.parameters)
        weights_hash = backend.weights_hash()
        self.shared.adopt(download.manifest, download.parameters, weights_hash)
        log.info(
            "model fetched peer-to-peer",
            extra={
                "client_id": self.identity.short_id,
                "parameters": len(download.parameters),
                "bytes": sum(len(v) for v in download.parameters.values()),
                "weights_hash": weights_hash.hex(),
                "corrupt_peers": [short_id(p) for p in download.corrupt_peers],
            },
        )

    # ------------------------------------------------------------------ mid-epoch join ports

    async def share_snapshot(self, coordinator: Coordinator, backend: TrainingBackend) -> None:
        """A member, at the round a joiner's snapshot is due (`coordinator.joining`): serve
        our weights of this step (the caller holds the model lock)."""
        await self._share(coordinator, backend, "model shared for a joiner")

    async def _share(self, coordinator: Coordinator, backend: TrainingBackend, what: str) -> None:
        """Serve `backend`'s weights as of the coordinator's step, and log `what` with the
        hash `SharedModel.share` computed (one pass over the weights, not two)."""
        step = coordinator.progress.step
        await self.shared.share(backend, step, coordinator.progress.epoch)
        weights_hash = self.shared.weights_hash
        log.info(
            what,
            extra={
                "client_id": self.identity.short_id,
                "step": step,
                "weights_hash": None if weights_hash is None else weights_hash.hex(),
            },
        )

    async def load_snapshot(
        self, coordinator: Coordinator, backend: TrainingBackend, step: int
    ) -> None:
        """A joiner: fetch the members' weights of `step` (their snapshot, vouched for by a
        majority of the members that answered, `model_share.choose_manifest`) into `backend`
        (the caller then holds the model lock). Raises `ModelShareError`."""
        me = self.identity.public_key
        peers = [peer for peer in self.members() if peer != me]
        vote = await poll_manifests(
            self.node, peers, wait=JOINER_WAIT, step=step, interval=SNAPSHOT_POLL_INTERVAL
        )
        await self._download_from_peers(backend, peers, vote)

    # ------------------------------------------------------------------ weights-check port

    async def check_weights(self, coordinator: Coordinator, backend: TrainingBackend) -> str:
        """At a Warmup: our weights against the members' majority (see `weights.sync`)."""
        members = [client.id for client in coordinator.epoch_state.clients]
        outcome = await WeightsSync(self.node, self.shared).check(backend, coordinator, members)
        log.info(
            "weights check: %s",
            outcome.status,
            extra={
                "client_id": self.identity.short_id,
                "step": coordinator.progress.step,
                "agreeing": outcome.agreeing,
                "members": outcome.members,
                "weights_hash": backend.weights_hash().hex(),
            },
        )
        return outcome.status

    # ------------------------------------------------------------------ Cooldown port

    async def cooldown(self, coordinator: Coordinator, backend: TrainingBackend) -> None:
        step = coordinator.progress.step
        await self._share(coordinator, backend, "model shared for late joiners")
        options = self.checkpointing
        if options.dir is None:
            return
        # never raises for a failed save or upload (logged; the next Cooldown tries again)
        outcome = await checkpoint_model(
            backend,
            options.dir,
            self.run_id,
            step - 1,
            options.retained,
            options.hub_repo,
            os.environ.get("HF_TOKEN"),
        )
        path = None if outcome.path is None else str(outcome.path)
        self.stats.checkpointed(path, outcome.revision, outcome.error)
        if options.hub_repo and outcome.revision is not None:
            await self.uplink.send_checkpoint(
                HubCheckpoint(repo_id=options.hub_repo, revision=outcome.revision)
            )


def _peer_config(vote: ManifestVote) -> PeerConfig | None:
    """The model config of the manifest the peers vouched for (None when it carries none);
    parsed and checked to be a JSON object when the manifest was decoded."""
    try:
        return vote.manifest.config()
    except ValueError as exc:  # a manifest built locally, never decoded
        raise ModelShareError(f"the peers' model config is unusable: {exc}") from exc
