"""The client application: wires the server link, the P2P node and the round runner.

`run_client(options)` connects to the server, starts the P2P node, loads the model when the
first Warmup lists us (checkpoint from the Hub / a local directory / a builtin preset, or
peer-to-peer after the first epoch), follows the coordinator until the run is Finished or the
connection drops, and shares/saves the model at every Cooldown (`psyche_client.model.sharing`).
It returns the exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psyche_common.client_id import short_id
from psyche_common.protocol import Identity

from psyche_client.model.sharing import SharedModel, save_checkpoint, upload_checkpoint
from psyche_client.p2p.config import P2PConfig
from psyche_client.p2p.model_share import download_model, poll_manifests
from psyche_client.p2p.node import P2PNode
from psyche_client.round.ports import DesyncError, RunnerOptions, run_state_name
from psyche_client.round.runner import RoundRunner
from psyche_client.server_link import ServerLink, ServerLinkError
from psyche_client.stats import ClientStats
from psyche_client.training.backend import DummyBackend, TrainingBackend

log = logging.getLogger("psyche.client")

TICK_INTERVAL = 0.5


@dataclass
class ClientOptions:
    """Everything `psyche-client train` configures (see cli.py for each flag's meaning)."""

    server_addr: str
    run_id: str
    identity: Identity
    bind_p2p_port: int = 0
    bind_p2p_interface: str = "0.0.0.0"
    advertise_host: str | None = None
    device: str = "auto"
    micro_batch_size: int = 1
    checkpoint_dir: Path | None = None
    hub_repo: str | None = None
    write_gradients_dir: Path | None = None
    max_concurrent_parameter_requests: int = 8
    max_concurrent_downloads: int = 4
    dummy_training_delay_secs: float | None = None
    exit_when_finished: bool = True
    keep_checkpoints: int = 3
    data_parallelism: int = 1
    fsdp: bool = False
    parallel_timeout: float = 300.0


class NodeNetwork:
    """Adapts `P2PNode` to the round runner's `PeerNetwork` protocol."""

    def __init__(self, node: P2PNode) -> None:
        self.node = node

    async def announce(self, announcement: Any) -> None:
        await self.node.announce(announcement)

    def publish_blob(self, data: bytes, step: int) -> bytes:
        return self.node.publish_blob(data, step=step)

    async def fetch_blob(self, blob_hash: bytes, size: int, providers: Any) -> bytes:
        return await self.node.fetch_blob(blob_hash, providers, expected_size=size)

    def begin_step(self, step: int) -> None:
        self.node.set_step(step)
        self.node.forget_before(step - 2)


class ClientApp:
    """One client: owns its P2P node, server link, round runner, statistics and the model it
    shares after a Cooldown; `run()` returns the process exit code."""

    def __init__(
        self, options: ClientOptions, on_snapshot: Callable[[ClientApp], None] | None = None
    ):
        self.options = options
        self.identity = options.identity
        self.stats = ClientStats()
        self.shared = SharedModel()
        self.members: set[bytes] = set()
        self.peer_addresses: dict[bytes, str] = {}
        self.coordinator: Any = None
        self.on_snapshot = on_snapshot
        self.model_download_progress: tuple[int, int] | None = None
        config = P2PConfig(
            bind_host=options.bind_p2p_interface,
            port=options.bind_p2p_port,
            advertise_host=options.advertise_host,
            max_concurrent_downloads=options.max_concurrent_downloads,
            max_concurrent_parameter_requests=options.max_concurrent_parameter_requests,
        )
        self.node = P2PNode(
            self.identity,
            is_member=lambda peer: peer in self.members,
            config=config,
            on_announcement=self._on_announcement,
            get_manifest=lambda: self.shared.manifest,
            get_parameter_bytes=lambda name: self.shared.parameters.get(name),
        )
        self.runner: RoundRunner | None = None
        self.link: ServerLink | None = None

    def _on_announcement(self, announcement: Any, _from_peer: bytes) -> None:
        if self.runner is not None:
            self.runner.on_announcement(announcement)

    # ------------------------------------------------------------------ model loading

    async def _load_backend(self, coordinator: Any) -> TrainingBackend:
        checkpoint = coordinator.model.checkpoint
        kind = getattr(checkpoint, "kind", type(checkpoint).__name__)
        peers = [peer for peer in self.members if peer != self.identity.public_key]
        from_peers = kind in ("P2P", "P2PGcs") and bool(peers)
        if self.options.dummy_training_delay_secs is not None:
            backend: Any = DummyBackend(self.options.dummy_training_delay_secs)
        elif self.options.data_parallelism > 1:
            from psyche_client.training.parallel.backend import ParallelBackend
            from psyche_client.training.parallel.plan import ParallelSpec

            peer_config = await self._peer_config(peers) if from_peers else None
            backend = await asyncio.to_thread(
                ParallelBackend.load,
                coordinator,
                spec=ParallelSpec(self.options.data_parallelism, self.options.fsdp),
                device=self.options.device,
                micro_batch_size=self.options.micro_batch_size,
                timeout=self.options.parallel_timeout,
                from_peers=from_peers,
                peer_config=peer_config,
            )
        else:
            from psyche_client.training.distro_backend import DistroBackend

            peer_config = await self._peer_config(peers) if from_peers else None
            backend = await asyncio.to_thread(
                DistroBackend.load,
                coordinator,
                device=self.options.device,
                micro_batch_size=self.options.micro_batch_size,
                from_peers=from_peers,
                peer_config=peer_config,
            )
        if from_peers:
            await self._download_from_peers(backend, peers)
        return backend

    async def _peer_config(self, peers: list[bytes]) -> dict[str, Any] | None:
        """The model config a majority of peers shares (None when they share none)."""
        vote = await poll_manifests(self.node, peers)
        if not vote.manifest.config_json:
            return None
        return json.loads(vote.manifest.config_json)

    async def _download_from_peers(self, backend: Any, peers: list[bytes]) -> None:
        log.info("fetching the model from %d peer(s)", len(peers))

        def progress(done: int, total: int) -> None:
            self.model_download_progress = (done, total)

        download = await download_model(self.node, peers, on_progress=progress)
        await asyncio.to_thread(backend.load_parameters, download.parameters)
        log.info(
            "model fetched peer-to-peer",
            extra={
                "client_id": self.identity.short_id,
                "parameters": len(download.parameters),
                "bytes": sum(len(v) for v in download.parameters.values()),
                "weights_hash": backend.weights_hash().hex(),
                "corrupt_peers": [short_id(p) for p in download.corrupt_peers],
            },
        )

    # ------------------------------------------------------------------ cooldown

    async def _cooldown(self, coordinator: Any, backend: TrainingBackend) -> None:
        step = coordinator.progress.step
        await self.shared.share(backend, step, coordinator.progress.epoch)
        log.info(
            "model shared for late joiners",
            extra={
                "client_id": self.identity.short_id,
                "step": step,
                "weights_hash": backend.weights_hash().hex(),
            },
        )
        directory = self.options.checkpoint_dir
        if directory is None:
            return
        target = await save_checkpoint(
            backend, directory, self.options.run_id, step - 1, self.options.keep_checkpoints
        )
        if self.options.hub_repo:
            revision = await upload_checkpoint(
                target, self.options.hub_repo, os.environ.get("HF_TOKEN"), step - 1
            )
            assert self.link is not None
            await self.link.send_checkpoint(
                {"Hub": {"repo_id": self.options.hub_repo, "revision": revision}}
            )

    # ------------------------------------------------------------------ main loop

    async def run(self) -> int:
        await self.node.start()
        try:
            try:
                self.link = await ServerLink.connect(
                    self.options.server_addr,
                    self.identity,
                    self.options.run_id,
                    self.node.address,
                )
            except (ServerLinkError, ValueError) as exc:
                log.error("%s", exc)
                return 1
            self.runner = RoundRunner(
                self.identity,
                NodeNetwork(self.node),
                self.link,
                self._load_backend,
                self._make_fetcher(),
                RunnerOptions(
                    write_gradients_dir=self.options.write_gradients_dir,
                    needs_data=self.options.dummy_training_delay_secs is None,
                ),
                on_cooldown=self._cooldown,
                stats=self.stats,
            )
            tasks = [
                asyncio.create_task(self._follow_server(self.link, self.runner), name="server"),
                asyncio.create_task(self.runner.wait_fatal(), name="fatal"),
                asyncio.create_task(self._tick_forever(self.runner), name="ticker"),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            return _exit_code(next(iter(done)))
        finally:
            if self.runner is not None:
                await self.runner.aclose()
            if self.link is not None:
                await self.link.close()
            with contextlib.suppress(Exception):
                await self.node.close()

    async def _follow_server(self, link: ServerLink, runner: RoundRunner) -> None:
        """Feed every new coordinator state to the runner; return when the run is Finished
        (with `exit_when_finished`)."""
        from psyche_common.coordinator import Coordinator

        async for update in link.states():
            coordinator = Coordinator.from_wire(update.coordinator)
            self.coordinator = coordinator
            self.members = {c.id for c in coordinator.epoch_state.clients}
            self.node.set_peers(update.peers)
            self.peer_addresses = update.peers
            state = run_state_name(coordinator)
            if state == "RoundTrain" and runner.active != "training":
                self.shared.clear()
            await runner.on_state(coordinator)
            if state == "Finished" and self.options.exit_when_finished:
                return

    async def _tick_forever(self, runner: RoundRunner) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL)
            await runner.tick()
            if self.on_snapshot is not None:
                self.on_snapshot(self)

    def _make_fetcher(self) -> Any:
        """``batch -> samples`` for the run's data_location (provider built on first use)."""
        if self.options.dummy_training_delay_secs is not None:
            return None
        lock = asyncio.Lock()
        holder: dict[str, Any] = {}

        async def server_provider(address: str, seq_len: int, identity: Any) -> Any:
            from psyche_common.data.server_client import DataServerProvider

            return DataServerProvider(address, identity)

        async def fetch(batch: Any) -> Any:
            async with lock:
                if "provider" not in holder:
                    from psyche_common.data import make_provider

                    holder["provider"] = await make_provider(
                        self.coordinator.model.data_location,
                        self.coordinator.model.max_seq_len,
                        identity=self.identity,
                        server_provider=server_provider,
                    )
            return await holder["provider"].get_samples(batch)

        return fetch


def _exit_code(first: asyncio.Task[Any]) -> int:
    """The exit code for the task that ended the client first (logging why): 0 the run
    finished, 1 the server link failed, 2 the client failed, 3 its weights desynchronized."""
    if first.cancelled():
        return 1
    error = first.exception()
    if first.get_name() == "fatal":
        error = first.result()
    if error is None:
        log.info("run finished; exiting")
        return 0
    if isinstance(error, ServerLinkError):
        log.error("%s", error)
        return 1
    if isinstance(error, DesyncError):
        log.error("desync: %s", error)
        return 3
    log.error("client failed: %s", error, exc_info=error)
    return 2


async def run_client(options: ClientOptions) -> int:
    return await ClientApp(options).run()
