"""The client application: wires the server session, the P2P node and the round runner.

`run_client(options)` starts the P2P node, connects to the server, loads the model when the
first Warmup lists us (checkpoint from the Hub / a local directory / a builtin preset, or
peer-to-peer after the first epoch), follows the coordinator until the run is Finished, and
shares/saves the model at every Cooldown (`psyche_client.model.sharing`). When the server
connection is lost the model, the P2P node and the round runner stay up while
`reconnect.ServerSession` connects again (for up to `server_reconnect_timeout` seconds). It
returns the exit code.
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
from psyche_common.coordinator import Coordinator, RunState
from psyche_common.data.fetcher import DataSource, SampleFetcher
from psyche_common.data.retry import RetryPolicy
from psyche_common.pacing import MEGABIT
from psyche_common.protocol import Identity
from psyche_common.protocol.messages import Reachability, WeightsMismatch

from psyche_client.model.sharing import SharedModel, checkpoint_model
from psyche_client.model.sync import WeightsSync
from psyche_client.p2p.config import P2PConfig
from psyche_client.p2p.model_share import (
    JOINER_NOT_SHARED_WAIT,
    download_model,
    poll_manifests,
)
from psyche_client.p2p.node import P2PNode
from psyche_client.p2p.relay import RelayClient
from psyche_client.reconnect import ServerSession
from psyche_client.round.phase import Phase
from psyche_client.round.ports import RunnerOptions
from psyche_client.round.runner import RoundRunner
from psyche_client.server_link import ServerLink, ServerLinkError, parse_server_addr
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
    advertise_port: int | None = None
    device: str = "auto"
    micro_batch_size: int = 1
    checkpoint_dir: Path | None = None
    hub_repo: str | None = None
    write_gradients_dir: Path | None = None
    max_concurrent_parameter_requests: int = 8
    max_concurrent_downloads: int = 4
    gossip_fanout: int = 8
    p2p_max_inbound_connections: int = 256
    p2p_max_inbound_per_ip: int = 16
    p2p_max_concurrent_serving: int = 32
    p2p_max_result_size: int = 256 * 1024 * 1024
    max_upload_mbps: float | None = None
    """Cap on model-share uploads in Mbit/s (None: no cap)."""
    dummy_training_delay_secs: float | None = None
    dummy_result_size: int = DummyBackend.PAYLOAD_SIZE
    dummy_model_size: int = 0
    exit_when_finished: bool = True
    keep_checkpoints: int = 3
    data_fetch_attempts: int = 7
    data_fetch_retry_delay: float = 2.0
    server_reconnect_timeout: float = 600.0
    """Seconds to keep reconnecting after losing the server (0: exit at once)."""
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
        self.reachability: Reachability | None = None
        """The server's last verdict on our P2P address (None until its probe ends)."""
        self.relay: RelayClient | None = None
        """Our use of the server's relay (None: the server offers none, or has not said)."""
        self._closing_relays: set[asyncio.Future[None]] = set()
        self.coordinator: Any = None
        self.on_snapshot = on_snapshot
        self.model_download_progress: tuple[int, int] | None = None
        config = P2PConfig(
            bind_host=options.bind_p2p_interface,
            port=options.bind_p2p_port,
            advertise_host=options.advertise_host,
            advertise_port=options.advertise_port,
            max_concurrent_downloads=options.max_concurrent_downloads,
            gossip_fanout=options.gossip_fanout,
            max_inbound_connections=options.p2p_max_inbound_connections,
            max_inbound_per_ip=options.p2p_max_inbound_per_ip,
            max_concurrent_serving=options.p2p_max_concurrent_serving,
            max_result_size=options.p2p_max_result_size,
            max_upload_rate=None
            if options.max_upload_mbps is None
            else options.max_upload_mbps * MEGABIT,
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
        self.server = ServerSession(self._connect, options.server_reconnect_timeout)
        self.fetcher = self._make_fetcher()

    async def _connect(self, timeout: float) -> ServerLink:
        """A new connection to the server, with our identity and P2P address (sends Join)."""
        link = await ServerLink.connect(
            self.options.server_addr,
            self.identity,
            self.options.run_id,
            self.node.address,
            timeout=timeout,
        )
        link.on_weights_mismatch = self._on_weights_mismatch
        link.on_reachability = self._on_reachability
        return link

    def _on_reachability(self, notice: Reachability) -> None:
        """The server connected back to our advertised P2P address (or failed to): without
        inbound connections we dial every peer and are served over those connections."""
        self.reachability = notice
        if notice.reachable:
            log.info(
                "reachable by peers at %s (the server sees us from %s)",
                notice.p2p_address,
                notice.observed_host,
                extra={"p2p_address": notice.p2p_address, "observed_host": notice.observed_host},
            )
        else:
            log.warning(
                "NOT reachable by peers at %s (the server sees us from %s: %s): dialing every "
                "peer instead; open or forward the P2P port, or give --advertise-addr",
                notice.p2p_address,
                notice.observed_host,
                notice.detail,
                extra={"p2p_address": notice.p2p_address, "observed_host": notice.observed_host},
            )
        self.node.set_outbound_only(not notice.reachable)
        self._use_relay(notice.relay_port)

    def _use_relay(self, port: int | None) -> None:
        """Keep a listen channel at the server's relay (on the coordinator's host), so peers
        that cannot connect to us reach us through it, and reach such peers the same way.
        A restarted server may announce another port: the old relay client is replaced."""
        current = self.relay
        if current is not None and current.port == port:
            current.retry_now()  # a (re)join: the relay accepts us from now on
            return
        if current is not None:
            self._closing_relays.add(asyncio.ensure_future(current.close()))
        self.relay = None
        if port is not None:
            host, _ = parse_server_addr(self.options.server_addr)
            self.relay = RelayClient(
                self.identity, host, port, self.options.run_id, self.node.accept_relayed
            )
            self.relay.start()
            log.info("the server relays P2P traffic at %s:%d", host, port)
        self.node.use_relay(self.relay)

    def _on_weights_mismatch(self, notice: WeightsMismatch) -> None:
        """The server saw our weights at a step differ from the majority's: resync."""
        mine = self.stats.weights_hashes.get(notice.step)
        if self.runner is None or mine == notice.majority_hash:
            return
        self.runner.ctx.lose_sync(
            f"the server reports that our weights at step {notice.step} differ from the "
            f"majority's ({notice.majority_hash.hex()[:16]})"
        )

    def _on_announcement(self, announcement: Any, _from_peer: bytes) -> None:
        if self.runner is not None:
            self.runner.on_announcement(announcement)

    # ------------------------------------------------------------------ model loading

    async def _load_backend(self, coordinator: Coordinator) -> TrainingBackend:
        peers = [peer for peer in self.members if peer != self.identity.public_key]
        from_peers = coordinator.model.checkpoint.is_p2p and bool(peers)
        backend: TrainingBackend
        if self.options.dummy_training_delay_secs is not None:
            backend = DummyBackend(
                self.options.dummy_training_delay_secs,
                result_size=self.options.dummy_result_size,
                model_size=self.options.dummy_model_size,
            )
        elif self.options.data_parallelism > 1:
            peer_config = await self._peer_config(peers) if from_peers else None
            backend = await asyncio.to_thread(
                _load_parallel_backend,
                coordinator,
                data_parallelism=self.options.data_parallelism,
                fsdp=self.options.fsdp,
                device=self.options.device,
                micro_batch_size=self.options.micro_batch_size,
                timeout=self.options.parallel_timeout,
                from_peers=from_peers,
                peer_config=peer_config,
            )
        else:
            peer_config = await self._peer_config(peers) if from_peers else None
            # importing torch and transformers takes seconds (tens on a loaded machine): in the
            # worker thread, so that the event loop keeps reading the server's states
            backend = await asyncio.to_thread(
                _load_distro_backend,
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
        """The model config a majority of peers shares (None when they share none). Peers
        that share no model yet are given time: after a server restart mid-epoch the members
        share theirs only once their Warmup weights check has run."""
        vote = await poll_manifests(self.node, peers, not_shared_wait=JOINER_NOT_SHARED_WAIT)
        if not vote.manifest.config_json:
            return None
        return json.loads(vote.manifest.config_json)

    async def _download_from_peers(self, backend: Any, peers: list[bytes]) -> None:
        log.info("fetching the model from %d peer(s)", len(peers))

        def progress(done: int, total: int) -> None:
            self.model_download_progress = (done, total)

        download = await download_model(
            self.node, peers, on_progress=progress, not_shared_wait=JOINER_NOT_SHARED_WAIT
        )
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

    async def _check_weights(self, coordinator: Coordinator, backend: TrainingBackend) -> str:
        """At a Warmup: our weights against the members' majority (see `model.sync`)."""
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
        # never raises for a failed save or upload (logged; the next Cooldown tries again)
        outcome = await checkpoint_model(
            backend,
            directory,
            self.options.run_id,
            step - 1,
            self.options.keep_checkpoints,
            self.options.hub_repo,
            os.environ.get("HF_TOKEN"),
        )
        path = None if outcome.path is None else str(outcome.path)
        self.stats.checkpointed(path, outcome.revision, outcome.error)
        if self.options.hub_repo and outcome.revision is not None:
            await self.server.uplink.send_checkpoint(
                {"Hub": {"repo_id": self.options.hub_repo, "revision": outcome.revision}}
            )

    # ------------------------------------------------------------------ main loop

    async def run(self) -> int:
        await self.node.start()
        try:
            try:
                await self.server.open()
            except (ServerLinkError, ValueError) as exc:
                log.error("%s", exc)
                return 1
            self.runner = RoundRunner(
                self.identity,
                NodeNetwork(self.node),
                self.server.uplink,
                self._load_backend,
                self.fetcher,
                RunnerOptions(
                    write_gradients_dir=self.options.write_gradients_dir,
                    needs_data=self.options.dummy_training_delay_secs is None,
                ),
                on_cooldown=self._cooldown,
                stats=self.stats,
                check_weights=self._check_weights,
            )
            tasks = [
                asyncio.create_task(self._follow_server(self.runner), name="server"),
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
            await self.server.aclose()
            if self.fetcher is not None:
                await self.fetcher.aclose()
            with contextlib.suppress(Exception):
                await self.node.close()
            if self.relay is not None:
                await self.relay.close()
            await asyncio.gather(*self._closing_relays, return_exceptions=True)

    async def _follow_server(self, runner: RoundRunner) -> None:
        """Feed every new coordinator state to the runner, across reconnections; return when
        the run is Finished (with `exit_when_finished`). While the server is away the runner
        simply receives nothing; its next state (typically WaitingForMembers) ends the epoch
        it was in."""
        async for update in self.server.updates():
            coordinator = Coordinator.from_wire(update.coordinator)
            self.coordinator = coordinator
            self.members = {c.id for c in coordinator.epoch_state.clients}
            self.node.set_peers(update.peers, update.unreachable)
            self.peer_addresses = update.peers
            if coordinator.run_state == RunState.RoundTrain and runner.phase != Phase.TRAINING:
                self.shared.clear()
            await runner.on_state(coordinator)
            if coordinator.run_state == RunState.Finished and self.options.exit_when_finished:
                return

    async def _tick_forever(self, runner: RoundRunner) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL)
            await runner.tick()
            if self.on_snapshot is not None:
                self.on_snapshot(self)

    def _make_fetcher(self) -> SampleFetcher | None:
        """Samples of a batch from the run's data_location (None with the dummy backend,
        which trains without data); its provider is built at the first fetch."""
        if self.options.dummy_training_delay_secs is not None:
            return None
        policy = RetryPolicy(self.options.data_fetch_attempts, self.options.data_fetch_retry_delay)
        return SampleFetcher(self._data_source, self.identity, policy)

    def _data_source(self) -> DataSource:
        """The run's data location and sample length, from the latest coordinator state, and
        its id (the data server's handshake names it)."""
        if self.coordinator is None:
            raise RuntimeError("no coordinator state yet: the run's data_location is unknown")
        model = self.coordinator.model
        return DataSource(model.data_location, int(model.max_seq_len), self.options.run_id)


def _load_distro_backend(
    coordinator: Coordinator,
    *,
    device: str,
    micro_batch_size: int,
    from_peers: bool,
    peer_config: dict[str, Any] | None,
) -> TrainingBackend:
    from psyche_client.training.distro_backend import DistroBackend

    return DistroBackend.load(
        coordinator,
        device=device,
        micro_batch_size=micro_batch_size,
        from_peers=from_peers,
        peer_config=peer_config,
    )


def _load_parallel_backend(
    coordinator: Coordinator, *, data_parallelism: int, fsdp: bool, **options: Any
) -> TrainingBackend:
    """Like `_load_distro_backend`, over several local ranks (torch imported here too)."""
    from psyche_client.training.parallel.backend import ParallelBackend
    from psyche_client.training.parallel.plan import ParallelSpec

    return ParallelBackend.load(coordinator, spec=ParallelSpec(data_parallelism, fsdp), **options)


def _exit_code(first: asyncio.Task[Any]) -> int:
    """The exit code for the task that ended the client first (logging why): 0 the run
    finished, 1 the server link failed, 2 the client failed."""
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
    log.error("client failed: %s", error, exc_info=error)
    return 2


async def run_client(options: ClientOptions) -> int:
    return await ClientApp(options).run()
