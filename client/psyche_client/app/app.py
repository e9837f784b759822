"""The client application: wires the server session, the P2P node, the model's lifecycle and
the round runner, each built through `Parts`.

`ClientApp.run()` starts the P2P node, connects to the server, follows the coordinator until
the run is Finished and returns the exit code. The model is loaded, checked at each Warmup and
shared/saved at each Cooldown by `weights.lifecycle.ModelLifecycle`. When the server
connection is lost the model, the P2P node and the round runner stay up while
`session.reconnect.ServerSession` connects again (for up to `server.reconnect_timeout`
seconds). Before any of it the metrics sink opens (`Parts.metrics`; wandb with
`--wandb-project`): `metrics.reporter.StepReporter` hands it each finished step. With
`--eval-*` an `evals.scheduler.EvalScheduler` evaluates the model whenever the round pipeline
is idle; its scores go to the sink too (`eval/<task>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from psyche_common.coordinator import Coordinator, RunState
from psyche_common.data.fetcher import SampleFetcher
from psyche_common.protocol.messages import WeightsMismatch

from psyche_client.app.options import ClientOptions
from psyche_client.app.outcome import exit_code, first_to_end
from psyche_client.app.parts import Parts
from psyche_client.app.snapshot import ClientSnapshot, take_snapshot
from psyche_client.evals.scheduler import EvalScheduler
from psyche_client.metrics.reporter import StepReporter
from psyche_client.metrics.run_outputs import RunOutputs
from psyche_client.metrics.sink import FanoutSink, MetricsStartError, NullSink
from psyche_client.p2p.inbox import Taken, VerifiedAnnouncement
from psyche_client.round.phase import Phase
from psyche_client.round.runner import RoundRunner
from psyche_client.round.stats import ClientStats
from psyche_client.session.data_source import run_data_source
from psyche_client.session.reachability import PeerReachability
from psyche_client.session.reconnect import ServerSession
from psyche_client.session.server_link import ServerLink, ServerLinkError
from psyche_client.training.backend import OptimStats
from psyche_client.weights.lifecycle import ModelLifecycle

log = logging.getLogger("psyche.client")

TICK_INTERVAL = 0.5


class ClientApp:
    """One client: owns its P2P node, server session, model lifecycle, round runner and
    statistics; `run()` returns the process exit code."""

    def __init__(self, options: ClientOptions, parts: Parts | None = None) -> None:
        parts = parts or Parts()
        self.parts = parts
        self.options = options
        self.identity = options.identity
        self.stats = ClientStats()
        self.members: set[bytes] = set()
        self.joiners: set[bytes] = set()
        """Mid-epoch joiners: not members, but peers that may link to us (they follow the
        rounds; `round.joiner`)."""
        self.peer_addresses: dict[bytes, str] = {}
        self.coordinator: Coordinator | None = None
        self.node = parts.node(
            self.identity,
            is_member=lambda peer: peer in self.members or peer in self.joiners,
            config=options.p2p,
            on_announcement=self._on_announcement,
            get_manifest=lambda: self.lifecycle.shared.manifest,
            get_parameter_bytes=lambda name: self.lifecycle.shared.parameters.get(name),
            holds_model=self._holds_model,
        )
        self.network = parts.network(self.node)
        self.reach = PeerReachability(
            self.node,
            self.identity,
            options.server.addr,
            options.server.run_id,
            server_key=options.server.server_key,
        )
        self.runner: RoundRunner | None = None
        self.server = ServerSession(
            self._connect, options.server.reconnect_timeout, uplink=parts.uplink()
        )
        self.lifecycle = ModelLifecycle(
            self.node,
            self.identity,
            options.server.run_id,
            lambda: self.members,
            options.backend,
            options.checkpointing,
            self.stats,
            self.server.uplink,
            parts.backends,
        )
        self.metrics = StepReporter(
            NullSink(),
            self.stats,
            self.node.stats,
            self._take_optim_stats,
        )
        """Hands each finished step's figures to the metrics sink (`run` opens it)."""
        self.outputs = RunOutputs(self.stats, self.node.stats)
        """The event files and the local metrics port (`run` opens what the flags ask for)."""
        self.evals: EvalScheduler | None = None
        if options.evals.enabled:
            self.evals = EvalScheduler(
                options.evals,
                self.stats,
                self.identity.short_id,
                on_scores=self.metrics.eval_scores,
            )
        self.fetcher: SampleFetcher | None = None
        if options.backend.kind != "dummy":  # the dummy backend trains without data
            self.fetcher = parts.fetcher(
                lambda: run_data_source(
                    self.coordinator, options.server.run_id, options.server.server_key
                ),
                self.identity,
                options.data,
            )

    def _take_optim_stats(self) -> OptimStats:
        """The loaded backend's optimizer statistics measured since the last call (none
        from a backend that measures none, or before one is loaded)."""
        backend = self.runner.backend if self.runner is not None else None
        take = None if backend is None else backend.capabilities.optim_stats
        return [] if take is None else take()

    def _holds_model(self) -> bool:
        """Whether this process holds the run's weights (told the server at every Join, and
        peers asking for a manifest before we share one)."""
        return self.runner is not None and self.runner.backend is not None

    async def _connect(self, timeout: float) -> ServerLink:
        """A new connection to the server, with our identity and P2P address (sends Join)."""
        link = await ServerLink.connect(
            self.options.server.addr,
            self.identity,
            self.options.server.run_id,
            self.node.address,
            timeout=timeout,
            authorization=self.options.server.authorization,
            holds_model=self._holds_model,
            server_key=self.options.server.server_key,
        )
        link.on_weights_mismatch = self._on_weights_mismatch
        link.on_reachability = self.reach.on_notice
        return link

    def _on_weights_mismatch(self, notice: WeightsMismatch) -> None:
        """The server saw our weights at a step differ from the majority's: resync."""
        mine = self.stats.weights_hashes.get(notice.step)
        if self.runner is None or mine == notice.majority_hash:
            return
        self.runner.lose_sync(
            f"the server reports that our weights at step {notice.step} differ from the "
            f"majority's ({notice.majority_hash.hex()[:16]})"
        )

    def _on_announcement(self, announcement: VerifiedAnnouncement, _from_peer: bytes) -> Taken:
        """What the pipeline did with the announcement (`p2p.inbox.Taken`)."""
        if self.runner is None:
            return Taken.NOT_NOW
        return self.runner.on_announcement(announcement)

    def snapshot(self) -> ClientSnapshot:
        """The client as the dashboard shows it, now."""
        return take_snapshot(
            self.identity.public_key,
            self.coordinator,
            self.runner,
            self.stats,
            self.node,
            self.peer_addresses,
            self.server.status,
            self.reach.notice,
            self.lifecycle.download_progress,
        )

    def make_runner(self) -> RoundRunner:
        """The round pipeline over this client's parts (with the policies of its `Parts`)."""
        return RoundRunner(
            self.identity,
            self.network,
            self.server.uplink,
            self.lifecycle.load_backend,
            self.fetcher,
            replace(self.options.round, needs_data=self.options.backend.kind != "dummy"),
            on_cooldown=self.lifecycle.cooldown,
            stats=self.stats,
            check_weights=self.lifecycle.check_weights,
            accuse=self.parts.accusation,
            share_snapshot=self.lifecycle.share_snapshot,
            load_snapshot=self.lifecycle.load_snapshot,
        )

    # ------------------------------------------------------------------ main loop

    async def run(self) -> int:
        options = self.options
        try:
            self.metrics.sink = await asyncio.to_thread(
                self.parts.metrics, options.metrics, options.server.run_id, self.identity.short_id
            )
            self.outputs = await asyncio.to_thread(
                RunOutputs.open,
                options.metrics,
                options.server.run_id,
                self.identity.public_key,
                self.stats,
                self.node.stats,
            )
        except MetricsStartError as exc:
            log.error("%s", exc)
            await asyncio.to_thread(self.metrics.sink.close)
            return 1
        if self.outputs.sink is not None:
            self.metrics.sink = FanoutSink(self.metrics.sink, self.outputs.sink)
        try:
            return await self._run()
        finally:
            await asyncio.to_thread(self.metrics.sink.close)
            self.outputs.close()

    async def _run(self) -> int:
        try:
            await self.node.start()
        except OSError as exc:
            p2p = self.options.p2p
            log.error(
                "cannot listen for peers (--bind-p2p-port %d, --bind-p2p-interface %s): %s; "
                "choose a free port, or 0 for any free port",
                p2p.port,
                p2p.bind_host,
                exc.strerror or exc,
            )
            return 1
        try:
            try:
                await self.server.open()
            except (ServerLinkError, ValueError) as exc:
                log.error("%s", exc)
                return 1
            self.runner = self.make_runner()
            first = await first_to_end(
                {
                    "server": self._follow_server(self.runner),
                    "fatal": self.runner.wait_fatal(),
                    "ticker": self._tick_forever(self.runner),
                },
                # the evals never end the client: not among the tasks it waits on
                background=[]
                if self.evals is None
                else [self.evals.run(self.runner, lambda: self.coordinator)],
            )
            return exit_code(first)
        finally:
            # the server first: it withdraws a client whose connection closed at once
            await self.server.aclose()
            if self.runner is not None:
                await self.runner.aclose()
            if self.fetcher is not None:
                await self.fetcher.aclose()
            with contextlib.suppress(Exception):
                await self.node.close()
            await self.reach.aclose()

    async def _follow_server(self, runner: RoundRunner) -> None:
        """Feed every new coordinator state to the runner, across reconnections; return when
        the run is Finished (with `exit_when_finished`). While the server is away the runner
        simply receives nothing; its next state (typically WaitingForMembers) ends the epoch
        it was in."""
        async for update in self.server.updates():
            coordinator = Coordinator.from_wire(update.coordinator)
            self.coordinator = coordinator
            self.members = {c.id for c in coordinator.epoch_state.clients}
            self.joiners = {j.id for j in coordinator.epoch_state.joining}
            self.node.set_peers(update.peers, update.unreachable)
            self.node.authorizers = update.authorizers
            self.peer_addresses = update.peers
            if (
                coordinator.run_state == RunState.RoundTrain
                and runner.phase != Phase.TRAINING
                and not coordinator.config.join_mid_epoch
            ):
                # (a run with mid-epoch joins keeps it: a joiner builds its backend from it)
                self.lifecycle.shared.clear()
            await runner.on_state(coordinator)
            self.metrics.observe(coordinator)
            self.outputs.observe(coordinator)
            if (
                coordinator.run_state == RunState.Finished
                and self.options.server.exit_when_finished
            ):
                return

    async def _tick_forever(self, runner: RoundRunner) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL)
            await runner.tick()


async def run_client(options: ClientOptions, parts: Parts | None = None) -> int:
    return await ClientApp(options, parts).run()
