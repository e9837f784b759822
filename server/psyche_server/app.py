"""The coordinator server: owns the coordinator and what one tick of it does; wires the parts.

`ServerApp` is the asyncio shell around the pure `Coordinator`. It builds the parts and passes
each its collaborators: `membership` (connect, Join, notices, key reloads, disconnect),
`message_dispatch` (every other client message), `scheduler` (when to tick), `broadcast` (the
state every client is sent), `persistence.StateSaver` (the saved state: before every broadcast,
at each epoch end, and on the way out), the relay, and the optional TCP data server. A tick, its
own: kick the unhealthy, tick the coordinator with the clock, a random seed and the pending set,
end the run before a round would read past its data (`data_end`), then log, save, publish the
metrics and broadcast. `serve(stop)` runs until `stop`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.types import ACTIVE_STATES, ClientState, RunState, TickResult
from psyche_common.protocol import coordinator_domain, short_id
from psyche_common.protocol.messages import AnyClientMessage, parse_client_message

from .admission import DAY, Admission, AuthorizedKeysFile
from .bridge import unhealthy_exited_ids
from .broadcast import StateBroadcaster
from .client_messages import ConvictionLog
from .connections import Connection, ConnectionManager
from .consistency import WeightsHashMonitor
from .data_end import DataEnd
from .data_server import DataServer
from .joiner_proofs import JoinerProofs
from .membership import Membership
from .message_dispatch import MessageDispatcher
from .options import ServerOptions, ServerStats
from .persistence import StateSaver
from .reachability import ReachabilityChecker
from .relay import RelayServer
from .roster import ClientRoster
from .run_events import CoordinatorEvents
from .run_metrics import MetricsBoard, MetricsSnapshot, RunMetrics
from .scheduler import TickScheduler, state_timeout_deadline
from .state_log import RunStateLog

__all__ = ["ServerApp", "ServerOptions", "ServerStats", "state_timeout_deadline"]

log = logging.getLogger("psyche.server")


class ServerApp:
    """The running server. Create, `await start()`, then `await serve(stop_event)`."""

    def __init__(
        self,
        coordinator: Coordinator,
        options: ServerOptions | None = None,
        data_server: DataServer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # The parts call each other back (a probe's verdict, a divergent hash, a connection's
        # events, the relay's checks) through `membership` and `dispatcher`, built below.
        self.coordinator = coordinator
        self.options = options or ServerOptions()
        self.clock = clock
        self.data_server = data_server
        self.data_end = None if data_server is None else DataEnd(data_server.provider.num_sequences)
        """Ends the run before a round would read past the served data (`data_end`)."""
        self.roster = ClientRoster()
        self.reachability = ReachabilityChecker(
            lambda client_id, address, result: self.membership.tell_reachability(
                client_id, address, result
            )
        )
        self.weights = WeightsHashMonitor(
            on_divergence=lambda client_id, step, majority: self.membership.tell_divergent(
                client_id, step, majority
            )
        )
        self.joiner_proofs = JoinerProofs(coordinator, self.weights)
        """Mid-epoch joiners' weights reports, checked against the members' majority."""
        self.stats = ServerStats()
        self.port: int | None = None
        coordinator.reset_ephemeral()
        self.convictions = ConvictionLog(coordinator.verification)
        self.metrics = RunMetrics()
        """Per-step medians of witness reports and the server's counters (`run_metrics`)."""
        self.original_warmup_time = coordinator.config.warmup_time
        save_dir = self.options.save_state_dir
        self.saver = None if save_dir is None else StateSaver(save_dir, self.original_warmup_time)
        if self.options.init_warmup_time is not None:
            coordinator.config.warmup_time = self.options.init_warmup_time
        self.connections = ConnectionManager(
            "coordinator",
            parse_client_message,
            self.on_client_message,
            self.options.limits,
            identity=self.options.identity,
            domain=coordinator_domain(coordinator.run_id),
            service=f"the coordinator of run {coordinator.run_id!r}",
            on_connect=lambda conn: self.membership.on_connect(conn),
            on_disconnect=lambda conn: self.membership.on_disconnect(conn),
            idle_timeout=self.options.limits.idle_timeout,
        )
        keys_path = self.options.authorized_keys
        self.admission = (
            None
            if keys_path is None
            else Admission(
                AuthorizedKeysFile(keys_path),
                clock,
                max_delegates=self.options.max_delegates_per_authorizer,
                max_lifetime=self.options.max_authorization_days * DAY,
            )
        )
        """Who may join (`--authorized-keys`); None: an open run."""
        if self.admission is not None:
            self.admission.keys.load()  # AuthorizationError / OSError: the caller reports it
        relay_limits = self.options.relay
        self.relay = (
            None
            if relay_limits is None
            else RelayServer(
                coordinator.run_id,
                lambda client_id: self.membership.may_use_relay(client_id),
                relay_limits,
                in_epoch=lambda client_id: self.membership.in_epoch(client_id),
                identity=self.options.identity,
            )
        )
        self.broadcaster = StateBroadcaster(
            coordinator,
            self.roster,
            self.reachability,
            self.connections,
            self.stats,
            data_server,
            None if self.admission is None else self.admission.authorizers,
        )
        self.membership = Membership(
            coordinator,
            self.options,
            self.roster,
            self.connections.connections,
            self.reachability,
            self.admission,
            self.weights,
            self.relay,
            self.broadcaster.current_frame,
        )
        self.scheduler = TickScheduler(
            coordinator,
            clock,
            self.options.tick_interval,
            self.options.limits.max_message_ticks_per_second,
            self.stats,
            grid_tick=self._grid_tick,
            extra_tick=self._extra_tick,
        )
        self.dispatcher = MessageDispatcher(
            coordinator,
            clock,
            self.options.checkpointers,
            self.stats,
            self.weights,
            self.metrics,
            self.scheduler,
            self.membership.on_join,
            self.joiner_proofs,
        )
        self.state_log = RunStateLog(coordinator)
        """Logs each change of run state, made by a tick or by a client message."""
        self.metrics_board = MetricsBoard(self.metrics_snapshot())
        """The latest metrics snapshot, for exporter threads (`metrics_export`)."""
        self.events = CoordinatorEvents.open(self.options.events, coordinator)
        """The coordinator's records in `--events-dir` (None without it; `run_events`)."""

    # ------------------------------------------------------------------ lifecycle

    @property
    def pending(self) -> dict[bytes, None]:
        """Clients the coordinator is ticked with (joined, not kicked; in join order)."""
        return self.roster.pending

    @property
    def run_id(self) -> str:
        return self.coordinator.run_id

    @property
    def run_state(self) -> RunState:
        return self.coordinator.run_state

    @property
    def address(self) -> str:
        return f"{self.options.host}:{self.port}"

    async def start(self) -> int:
        """Start the data server (if any) and bind the coordinator port; returns the port."""
        if self.data_server is not None:
            await self.data_server.start()
            self.data_server.update_state(self.coordinator)
            self._check_data_end()
        if self.relay is not None and self._relay_shares_port:
            self.connections.share_port(self.relay.domain, self.relay.serve_authenticated)
        self.port = await self.connections.start(self.options.host, self.options.port)
        log.info(
            "coordinator listening on %s (run %r)",
            self.address,
            self.run_id,
            extra={"port": self.port, "run_id": self.run_id},
        )
        if self.relay is not None:
            await self._start_relay(self.relay, self.port)
        self.save_progress()  # the latest file describes this process from its start on
        if self.events is not None:
            self.events.observe(self.coordinator)
        return self.port

    @property
    def _relay_shares_port(self) -> bool:
        """No `--relay-port`, or the coordinator's own port."""
        relay_port = self.options.relay_port
        return relay_port is None or (relay_port == self.options.port and relay_port != 0)

    async def _start_relay(self, relay: RelayServer, coordinator_port: int) -> None:
        """The relay on the coordinator port (told apart by the handshake's domain), or on
        `--relay-port` when one is given."""
        if self._relay_shares_port:
            relay.serve_on_shared_port(coordinator_port)
            return
        relay_port = self.options.relay_port
        assert relay_port is not None
        try:
            await relay.start(self.options.host, relay_port)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot bind the relay port {relay_port} ({exc.strerror}); choose another "
                "with --relay-port, leave it out to share the coordinator port, or --no-relay",
            ) from exc

    async def serve(self, stop: asyncio.Event) -> None:
        """Tick (`scheduler.TickScheduler.run`) until `stop` is set; then save where a restart
        resumes and close."""
        try:
            await self.scheduler.run(stop)
        finally:
            self.save_on_exit()
            await self.close()

    async def on_client_message(self, conn: Connection, message: AnyClientMessage) -> None:
        """A client message (`message_dispatch`), then the run-state change it made, logged
        at once (the next tick would not see it as its own)."""
        await self.dispatcher.on_message(conn, message)
        self.state_log.note(f"{message.type} from {short_id(conn.peer_id)}")

    def seconds_until_timeout(self) -> float | None:
        """Seconds until the current state's timeout can first pass (`scheduler`)."""
        return self.scheduler.seconds_until_timeout()

    async def close(self) -> None:
        self.scheduler.cancel()
        await self.reachability.close()
        if self.relay is not None:
            await self.relay.close()
        await self.connections.close()
        if self.data_server is not None:
            await self.data_server.close()
        if self.events is not None:
            self.events.close()

    # ------------------------------------------------------------------ ticking

    def now(self) -> float:
        """The coordinator's clock: unix seconds (it keeps milliseconds)."""
        return self.clock()

    def kick_unhealthy_clients(self) -> None:
        for client_id in self.roster.kick_once(unhealthy_exited_ids(self.coordinator)):
            log.info(
                "removed unhealthy client %s from the pending set",
                short_id(client_id),
                extra={"client": short_id(client_id)},
            )

    def _grid_tick(self) -> None:
        """The tick on the grid: pick up a changed authorized-keys file, tick, broadcast."""
        self.reload_authorized_keys(force=False)
        self.tick()

    def _extra_tick(self) -> None:
        """A tick off the grid (a state's deadline, client messages): it broadcasts only when
        the coordinator changed."""
        self.tick(broadcast=False)
        self.broadcaster.broadcast_if_changed()

    def tick(self, broadcast: bool = True) -> None:
        """One server tick: kick the unhealthy, tick the coordinator, save, broadcast."""
        key = self.scheduler.state_key()
        self.kick_unhealthy_clients()
        result: TickResult | None
        try:
            pending = (
                list(self.pending)
                if self.admission is None
                else self.admission.seat_order(self.pending)
            )
            result = self.coordinator.tick(
                pending,
                self.now(),
                secrets.randbits(64),
                self.roster.holders(),
                sample_secret=secrets.token_bytes(32),
            )
        except CoordinatorError as exc:
            if exc.kind != ErrorKind.Halted:
                self.stats.coordinator_errors += 1
                log.warning("coordinator tick error: %s", exc)
            result = None
        self.stats.ticks += 1
        self._check_data_end()
        self.kick_unhealthy_clients()  # records this tick moved to exited, before the broadcast
        self.state_log.note("tick")
        if result is not None and result.epoch_ended:
            self._on_epoch_end(result.success)
        self.scheduler.note_state_change(key)
        self.post_state_change(broadcast)

    def _check_data_end(self) -> None:
        """Lower `total_steps` before a round would read past the served data."""
        if self.data_end is not None:
            self.data_end.check(self.coordinator, self.now())

    def _on_epoch_end(self, success: bool) -> None:
        if not success:
            log.info("Epoch abandoned", extra={"epoch": self.coordinator.progress.epoch})
            return
        log.info(
            "epoch ended (now epoch %d, step %d)",
            self.coordinator.progress.epoch,
            self.coordinator.progress.step,
            extra={
                "epoch": self.coordinator.progress.epoch,
                "step": self.coordinator.progress.step,
            },
        )
        path = None if self.saver is None else self.saver.save_epoch_end(self.coordinator)
        if path is not None:
            self.stats.saved_states.append(path)

    def save_progress(self) -> None:
        """Keep the latest saved state equal to where a restart would resume (written only
        when that changed, and before the broadcast that tells the clients)."""
        if self.saver is not None:
            self.saver.update(self.coordinator)

    def save_on_exit(self) -> None:
        """SIGTERM, SIGINT, `q`: write where a restart resumes one last time."""
        if self.saver is not None:
            self.saver.save_now(self.coordinator)

    def follow_members(self) -> None:
        """The weights-hash check counts the epoch's healthy members at its current step."""
        self.weights.advance(self.coordinator.progress.step)
        self.weights.set_members(
            (c.id for c in self.coordinator.epoch_state.clients if c.state == ClientState.Healthy),
            self.admission.voter if self.admission is not None else lambda client: client,
        )

    def post_state_change(self, broadcast: bool = True) -> None:
        self.metrics.count_convictions(self.convictions.log_new(self.coordinator.verification))
        self.membership.close_revoked()
        self.follow_members()
        self.joiner_proofs.check()  # a majority that formed since a joiner reported
        self.metrics.observe_departures(
            self.coordinator.progress.epoch,
            (c.id for c in self.coordinator.epoch_state.exited_clients),
        )
        self.metrics_board.publish(self.metrics_snapshot())
        if self.events is not None:
            self.events.observe(self.coordinator)
        if self.run_state in ACTIVE_STATES:
            self.coordinator.config.warmup_time = self.original_warmup_time
        self.save_progress()
        if broadcast:
            self.broadcast()

    def metrics_snapshot(self) -> MetricsSnapshot:
        relay_bytes = 0 if self.relay is None else self.relay.stats.forwarded
        return self.metrics.snapshot(
            run_id=self.run_id,
            step=self.coordinator.progress.step,
            epoch=self.coordinator.progress.epoch,
            run_state=self.run_state.name,
            members=len(self.coordinator.epoch_state.clients),
            pending=len(self.pending),
            relay_bytes_total=relay_bytes,
        )

    # ------------------------------------------------------------------ broadcasting

    def peers(self) -> dict[bytes, str]:
        """P2P addresses of the epoch's members whose reachability is known (`broadcast`)."""
        return self.broadcaster.peers()

    def state_frame(self, wire: dict[str, Any] | None = None) -> bytes:
        """The msgpack payload of a `CoordinatorState` (each link seals it for itself)."""
        return self.broadcaster.state_frame(wire)

    def broadcast(self, wire: dict[str, Any] | None = None) -> bytes:
        """Send the current state to every connection (and to the data server)."""
        return self.broadcaster.broadcast(wire)

    # ------------------------------------------------------------------ pause / resume

    @property
    def pause_pending(self) -> bool:
        return self.coordinator.pending_pause

    def toggle_pause(self) -> str:
        """Ctrl+P: resume when Paused, otherwise pause (deferred to cooldown when active)."""
        now = self.now()
        key = self.scheduler.state_key()
        try:
            if self.run_state == RunState.Paused:
                self.coordinator.resume(now)
                action = "resumed"
            else:
                self.coordinator.pause(now)
                action = "pause pending" if self.pause_pending else "paused"
        except CoordinatorError as exc:
            log.warning("pause/resume refused: %s", exc)
            return f"refused: {exc}"
        log.info("run %s", action, extra={"action": action})
        self.scheduler.note_state_change(key)
        self.post_state_change(broadcast=True)
        return action

    # ------------------------------------------------------------------ authorized keys

    def reload_authorized_keys(self, force: bool = True) -> bool:
        """Re-read `--authorized-keys` (`Membership.reload_authorized_keys`); True when the
        list was replaced."""
        return self.membership.reload_authorized_keys(force)
