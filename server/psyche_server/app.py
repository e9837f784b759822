"""The coordinator server: owns the coordinator, ticks it, serves clients, broadcasts state.

`ServerApp` is the asyncio shell around the pure `Coordinator`: it feeds it the clock, random
seeds, the pending set and client messages; broadcasts the full state after every change and on
every tick; withdraws clients that disconnect; kicks the unhealthy; keeps the saved state
current (`persistence.StateSaver`: before every broadcast, at each epoch end, and on the way
out); and runs the optional TCP data server, ending the run before a round would read past
its data (`data_end`). `serve(stop)` runs until `stop`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from psyche_common.config import seconds_to_ms
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.types import ACTIVE_STATES, ClientState, RunState, TickResult
from psyche_common.protocol import coordinator_domain, encode_payload, short_id
from psyche_common.protocol.messages import (
    AnyClientMessage,
    Join,
    Reachability,
    Rejected,
    WeightsMismatch,
    Witness,
    parse_client_message,
    to_wire,
)

from .admission import Admission, AuthorizedKeysFile
from .bridge import unhealthy_exited_ids
from .client_messages import ConvictionLog, apply_client_message, reported_weights
from .connections import CloseConnection, Connection, ConnectionManager
from .consistency import WeightsHashMonitor
from .data_end import DataEnd
from .data_server import DataServer
from .options import ServerOptions, ServerStats
from .persistence import StateSaver
from .reachability import ProbeResult, ReachabilityChecker
from .relay import RelayServer
from .roster import ClientRoster
from .run_metrics import MetricsBoard, MetricsSnapshot, RunMetrics

log = logging.getLogger("psyche.server")

MAX_REPORTED_EVALS = 4096
"""Clients whose last reported eval scores are remembered (to log only new ones)."""
TIMEOUT_TICK_MARGIN = 0.002
"""Seconds after a state's deadline that the extra tick runs (clock jitter)."""


def state_timeout_deadline(coordinator: Coordinator) -> float | None:
    """The first moment (unix seconds, millisecond resolution) at which the current state's
    `check_timeout` can pass: its start plus its duration, and never its start itself."""
    config = coordinator.config
    durations = {
        RunState.WaitingForMembers: config.waiting_for_members_extra_time,
        RunState.Warmup: config.warmup_time,
        RunState.RoundTrain: config.max_round_train_time,
        RunState.RoundWitness: config.round_witness_time,
        RunState.Cooldown: config.cooldown_time,
    }
    duration = durations.get(coordinator.run_state)
    if duration is None:
        return None
    return (coordinator.run_state_start_ms + max(seconds_to_ms(duration), 1)) / 1000


class ServerApp:
    """The running server. Create, `await start()`, then `await serve(stop_event)`."""

    def __init__(
        self,
        coordinator: Coordinator,
        options: ServerOptions | None = None,
        data_server: DataServer | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.coordinator = coordinator
        self.options = options or ServerOptions()
        self.clock = clock
        self.data_server = data_server
        self.data_end = None if data_server is None else DataEnd(data_server.provider.num_sequences)
        """Ends the run before a round would read past the served data (`data_end`)."""
        self.roster = ClientRoster()
        self.reachability = ReachabilityChecker(self._on_reachability)
        self.weights = WeightsHashMonitor(on_divergence=self._tell_divergent)
        self.stats = ServerStats()
        self.port: int | None = None
        self._last_state_frame: bytes | None = None
        self._last_wire: dict[str, Any] | None = None
        self._state_changed = asyncio.Event()
        self._message_tick: asyncio.Handle | asyncio.TimerHandle | None = None
        self._last_message_tick = -math.inf
        self._message_tick_key: tuple[RunState, int] | None = None
        coordinator.reset_ephemeral()
        self.convictions = ConvictionLog(coordinator.verification)
        self.metrics = RunMetrics()
        """Per-step medians of witness reports and the server's counters (`run_metrics`)."""
        self._reported_evals: dict[bytes, dict[str, float]] = {}
        self.original_warmup_time = coordinator.config.warmup_time
        save_dir = self.options.save_state_dir
        self.saver = None if save_dir is None else StateSaver(save_dir, self.original_warmup_time)
        if self.options.init_warmup_time is not None:
            coordinator.config.warmup_time = self.options.init_warmup_time
        self.connections = ConnectionManager(
            "coordinator",
            parse_client_message,
            self._on_message,
            self.options.limits,
            identity=self.options.identity,
            domain=coordinator_domain(coordinator.run_id),
            service=f"the coordinator of run {coordinator.run_id!r}",
            on_connect=self._on_connect,
            on_disconnect=self._on_disconnect,
            idle_timeout=self.options.limits.idle_timeout,
        )
        keys_path = self.options.authorized_keys
        self.admission = (
            None if keys_path is None else Admission(AuthorizedKeysFile(keys_path), clock)
        )
        """Who may join (`--authorized-keys`); None: an open run."""
        if self.admission is not None:
            self.admission.keys.load()  # AuthorizationError / OSError: the caller reports it
        self._revoked: set[bytes] = set()
        """Members whose key a reload removed: closed when they leave the epoch."""
        relay_limits = self.options.relay
        self.relay = (
            None
            if relay_limits is None
            else RelayServer(
                coordinator.run_id,
                self._may_use_relay,
                relay_limits,
                in_epoch=self._in_epoch,
                identity=self.options.identity,
            )
        )
        self.metrics_board = MetricsBoard(self.metrics_snapshot())
        """The latest metrics snapshot, for exporter threads (`metrics_export`)."""

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
        """Tick every `tick_interval` seconds (missed ticks are skipped) until `stop` is set.

        Between two grid ticks the server also ticks at the moment the current state's timeout
        can first fire (`seconds_until_timeout`, re-read whenever the state changes), so a
        state ends as soon as the coordinator's integer-second rules allow instead of up to
        one interval later; such an extra tick broadcasts only when it changed the state."""
        interval = self.options.tick_interval
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        try:
            while not stop.is_set():
                self.reload_authorized_keys(force=False)
                self.tick()
                next_tick += interval
                if next_tick < loop.time():
                    next_tick = loop.time() + interval  # skip missed ticks, no catch-up
                ticked_early_at: tuple[RunState, int] | None = None
                while not stop.is_set():
                    self._state_changed.clear()
                    remaining = next_tick - loop.time()
                    if remaining <= 0:
                        break
                    early = self.seconds_until_timeout()
                    if early is None or early >= remaining or ticked_early_at == self._state_key():
                        await self._sleep(stop, remaining)  # at most one early tick per state
                    elif not await self._sleep(stop, early):
                        ticked_early_at = self._state_key()
                        self.tick(broadcast=False)
                        self._broadcast_if_changed()
        finally:
            self.save_on_exit()
            await self.close()

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> bool:
        """Sleep until ``seconds`` pass, ``stop`` is set or the state changes; True unless the
        time simply passed."""
        waiters = [
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(self._state_changed.wait()),
        ]
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in waiters:
                waiter.cancel()
        return bool(done)

    def seconds_until_timeout(self) -> float | None:
        """Seconds until the current state's timeout can first pass `check_timeout` (a little
        after that unix second begins), or None when there is none ahead."""
        deadline = state_timeout_deadline(self.coordinator)
        if deadline is None:
            return None
        remaining = deadline + TIMEOUT_TICK_MARGIN - self.clock()
        return remaining if remaining > 0 else None

    def _state_key(self) -> tuple[RunState, int]:
        return self.coordinator.run_state, self.coordinator.run_state_start_ms

    def _note_state_change(self, before: tuple[RunState, int]) -> None:
        """Wake the tick loop when the state (or its start) changed, so it re-reads the
        state's timeout."""
        if self._state_key() != before:
            self._state_changed.set()

    async def close(self) -> None:
        if self._message_tick is not None:
            self._message_tick.cancel()
            self._message_tick = None
        await self.reachability.close()
        if self.relay is not None:
            await self.relay.close()
        await self.connections.close()
        if self.data_server is not None:
            await self.data_server.close()

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

    def tick(self, broadcast: bool = True) -> None:
        """One server tick: kick the unhealthy, tick the coordinator, save, broadcast."""
        key = self._state_key()
        self.kick_unhealthy_clients()
        before = (self.run_state, self.coordinator.progress.epoch)
        result: TickResult | None
        try:
            result = self.coordinator.tick(
                list(self.pending), self.now(), secrets.randbits(64), self.roster.holders()
            )
        except CoordinatorError as exc:
            if exc.kind != ErrorKind.Halted:
                self.stats.coordinator_errors += 1
                log.warning("coordinator tick error: %s", exc)
            result = None
        self.stats.ticks += 1
        self._check_data_end()
        self.kick_unhealthy_clients()  # records this tick moved to exited, before the broadcast
        after = (self.run_state, self.coordinator.progress.epoch)
        if after != before:
            log.info(
                "run state %s -> %s (epoch %d, step %d)",
                before[0].name,
                after[0].name,
                after[1],
                self.coordinator.progress.step,
                extra={
                    "old_state": before[0].name,
                    "new_state": after[0].name,
                    "epoch": after[1],
                    "step": self.coordinator.progress.step,
                },
            )
        if result is not None and result.epoch_ended:
            self._on_epoch_end(result.success)
        self._note_state_change(key)
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
            c.id for c in self.coordinator.epoch_state.clients if c.state == ClientState.Healthy
        )

    def post_state_change(self, broadcast: bool = True) -> None:
        self.metrics.count_convictions(self.convictions.log_new(self.coordinator.verification))
        self._close_revoked()
        self.follow_members()
        self.metrics.observe_departures(
            self.coordinator.progress.epoch,
            (c.id for c in self.coordinator.epoch_state.exited_clients),
        )
        self.metrics_board.publish(self.metrics_snapshot())
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
        """P2P addresses of the epoch's members (not of pending clients: `roster.peers`), once
        the server has connected back to each (reachable or not, `reachability`): an address is
        never handed out before its verdict, so no peer dials a private address behind a NAT
        in the moment between a Join and the state that marks it unreachable."""
        checked = self.reachability.reachable
        members = (client.id for client in self.coordinator.epoch_state.clients)
        return {cid: addr for cid, addr in self.roster.peers(members).items() if cid in checked}

    def state_frame(self, wire: dict[str, Any] | None = None) -> bytes:
        """The msgpack payload of a `CoordinatorState` (each link seals it for itself)."""
        peers = self.peers()
        return encode_payload(
            {
                "type": "CoordinatorState",
                "coordinator": self.coordinator.to_wire() if wire is None else wire,
                "peers": peers,
                "unreachable": self.reachability.unreachable(peers),
            }
        )

    def broadcast(self, wire: dict[str, Any] | None = None) -> bytes:
        """Send the current state to every connection (and to the data server)."""
        wire = self.coordinator.to_wire() if wire is None else wire
        frame = self.state_frame(wire)
        self._last_wire = wire
        self._last_state_frame = frame
        self.connections.broadcast_state(frame)
        self.stats.broadcasts += 1
        self.stats.last_broadcast_bytes = len(frame)
        if self.data_server is not None:
            self.data_server.update_state(self.coordinator)
        return frame

    def _broadcast_if_changed(self) -> None:
        """Broadcast now when the coordinator changed; a change of the peer list alone (a Join)
        goes out with the next tick, as in the reference, so N joins cost no N broadcasts."""
        wire = self.coordinator.to_wire()
        if wire != self._last_wire:
            self.broadcast(wire)

    # ------------------------------------------------------------------ pause / resume

    @property
    def pause_pending(self) -> bool:
        return self.coordinator.pending_pause

    def toggle_pause(self) -> str:
        """Ctrl+P: resume when Paused, otherwise pause (deferred to cooldown when active)."""
        now = self.now()
        key = self._state_key()
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
        self._note_state_change(key)
        self.post_state_change(broadcast=True)
        return action

    # ------------------------------------------------------------------ authorized keys

    def reload_authorized_keys(self, force: bool = True) -> bool:
        """Re-read `--authorized-keys` (force: now, as on SIGHUP; else when the file changed,
        at most every few seconds); clients it no longer admits leave the pending set, and
        are closed at once unless they are members of the current epoch (then when they stop
        being members). True when the list was replaced."""
        if self.admission is None:
            return False
        keys = self.admission.keys
        if not (keys.reload() if force else keys.reload_if_changed()):
            return False
        joined = [cid for cid, conn in self.connections.connections.items() if conn.joined]
        for client_id in self.admission.revoked(joined):
            self.roster.kick([client_id])
            self._revoked.add(client_id)
        self._close_revoked()
        return True

    def _close_revoked(self) -> None:
        """Close the connections of revoked clients that are not epoch members (any more)."""
        if not self._revoked:
            return
        members = {client.id for client in self.coordinator.epoch_state.clients}
        for client_id in [cid for cid in self._revoked if cid not in members]:
            self._revoked.discard(client_id)
            conn = self.connections.connections.get(client_id)
            if conn is None:
                continue
            reason = "not authorized: this key was removed from the server's authorized keys"
            log.warning("closing %s: %s", conn, reason, extra={"client": short_id(client_id)})
            conn.send(to_wire(Rejected(reason=reason)))
            conn.close(reason)

    # ------------------------------------------------------------------ connections

    def _on_connect(self, conn: Connection) -> None:
        timeout = self.options.limits.pre_join_timeout
        asyncio.get_running_loop().call_later(timeout, self._drop_if_not_joined, conn, timeout)

    def _drop_if_not_joined(self, conn: Connection, timeout: float) -> None:
        """`--pre-join-timeout`: an authenticated connection that never joined is closed."""
        if conn.joined or conn.closed:
            return
        reason = f"no Join within {timeout:g}s of the handshake"
        log.warning(
            "closing %s: %s",
            conn,
            reason,
            extra={"client": short_id(conn.peer_id), "remote": conn.remote, "reason": reason},
        )
        conn.send(to_wire(Rejected(reason=reason)))
        conn.close(reason)

    def _on_disconnect(self, conn: Connection) -> None:
        client_id = conn.peer_id
        self.roster.leave(client_id)
        self._revoked.discard(client_id)
        if self.admission is not None:
            self.admission.forget(client_id)
        self.weights.forget(client_id)
        self.reachability.forget(client_id)
        if self.relay is not None:
            self.relay.forget(client_id)
        if not self.options.withdraw_on_disconnect:
            return
        index = self.coordinator.client_index(client_id)
        if index is None:
            return
        try:
            self.coordinator.withdraw(index)
        except CoordinatorError as exc:
            log.info("Coordinator withdraw error for %s: %s", short_id(client_id), exc)
        else:
            log.info(
                "Withdrew %s (disconnected)",
                short_id(client_id),
                extra={"client": short_id(client_id), "index": index},
            )

    def _may_use_relay(self, client_id: bytes) -> bool:
        """Only clients connected here and joined may open relay pipes (or be reached)."""
        conn = self.connections.connections.get(client_id)
        return conn is not None and conn.joined

    def _in_epoch(self, client_id: bytes) -> bool:
        """Whether `client_id` is a member of the current epoch (relay pipes join members)."""
        return any(client.id == client_id for client in self.coordinator.epoch_state.clients)

    def _tell_divergent(self, client_id: bytes, step: int, majority: bytes) -> None:
        """Tell a client that its weights at `step` are not the majority's (it resyncs)."""
        conn = self.connections.connections.get(client_id)
        if conn is not None:
            conn.send(to_wire(WeightsMismatch(step=step, majority_hash=majority)))

    async def _on_message(self, conn: Connection, message: AnyClientMessage) -> None:
        self.stats.messages += 1
        if self._message_tick is None:
            self._message_tick_key = self._state_key()
        client_id = conn.peer_id
        if isinstance(message, Join):
            self._on_join(conn, message)
        else:
            report = reported_weights(message)
            if report is not None:
                # counted only from a member of this epoch (followed at every tick)
                self.weights.advance(self.coordinator.progress.step)
                self.weights.record(report[0], client_id, report[1])
            step = self.coordinator.progress.step
            try:
                apply_client_message(
                    self.coordinator,
                    client_id,
                    message,
                    self.now(),
                    self.options.checkpointers,
                )
            except CoordinatorError as exc:
                self.stats.coordinator_errors += 1
                log.warning(
                    "%s from %s refused: %s",
                    message.type,
                    short_id(client_id),
                    exc,
                    extra={
                        "client": short_id(client_id),
                        "message_type": message.type,
                        "error": str(exc),
                    },
                )
            else:
                if isinstance(message, Witness):  # counted only once the coordinator took it
                    metadata = message.metadata
                    self.metrics.record_witness(
                        step,
                        client_id,
                        metadata.loss,
                        metadata.tokens_per_sec,
                        metadata.bandwidth_per_sec,
                        metadata.evals,
                    )
                    self._log_new_evals(client_id, step, metadata.evals)
        self._schedule_message_tick()

    def _log_new_evals(self, client_id: bytes, step: int, evals: Mapping[str, float]) -> None:
        """Log a witness's eval scores when they differ from the last ones it reported (each
        report repeats the client's latest scores)."""
        if not evals or self._reported_evals.get(client_id) == evals:
            return
        if len(self._reported_evals) >= MAX_REPORTED_EVALS:
            self._reported_evals.clear()
        self._reported_evals[client_id] = dict(evals)
        log.info(
            "eval scores reported",
            extra={"client": short_id(client_id), "step": step, "evals": dict(evals)},
        )

    def _schedule_message_tick(self) -> None:
        """Tick once after the messages that are ready now (a burst of N messages, from one
        key or many, costs one tick and at most one broadcast, not N), and never sooner than
        `1 / max_message_ticks_per_second` after the previous message tick: however many
        keys send, messages cannot drive ticks faster than that."""
        if self._message_tick is not None:
            return
        loop = asyncio.get_running_loop()
        spacing = 1.0 / self.options.limits.max_message_ticks_per_second
        wait = self._last_message_tick + spacing - loop.time()
        if wait > 0:
            self._message_tick = loop.call_later(wait, self._tick_after_messages)
        else:
            self._message_tick = loop.call_soon(self._tick_after_messages)

    def _tick_after_messages(self) -> None:
        self._message_tick = None
        self._last_message_tick = asyncio.get_running_loop().time()
        key = self._message_tick_key or self._state_key()
        self._message_tick_key = None
        self.stats.message_ticks += 1
        self.tick(broadcast=False)
        self._note_state_change(key)
        self._broadcast_if_changed()

    def _on_join(self, conn: Connection, message: Join) -> None:
        client_id = conn.peer_id
        if message.run_id != self.run_id:
            log.warning(
                "%s tried to join unknown run %r",
                short_id(client_id),
                message.run_id,
                extra={"client": short_id(client_id), "run_id": message.run_id},
            )
            raise CloseConnection(
                f"unknown run id {message.run_id!r}: this server coordinates {self.run_id!r}"
            )
        if self.admission is not None:
            refusal = self.admission.admit(client_id, self.run_id, message.authorization)
            if refusal is not None:
                log.warning(
                    "refusing the Join of %s: %s",
                    short_id(client_id),
                    refusal,
                    extra={"client": short_id(client_id), "reason": refusal},
                )
                raise CloseConnection(f"not authorized: {refusal}")
        if not conn.joined:
            conn.joined = True  # from now on it gets every state, starting with the current one
            conn.send_frame(self._last_state_frame or self.state_frame())
        self.reachability.check(client_id, message.p2p_address)
        if self.roster.join(client_id, message.p2p_address, message.holds_model):
            log.info(
                "%s joined run %r (p2p %s, version %r%s)",
                short_id(client_id),
                self.run_id,
                message.p2p_address,
                message.client_version,
                "" if message.holds_model else ", without the run's weights yet",
                extra={
                    "client": short_id(client_id),
                    "p2p_address": message.p2p_address,
                    "holds_model": message.holds_model,
                },
            )

    def _on_reachability(self, client_id: bytes, address: str, result: ProbeResult) -> None:
        """A probe ended: tell the client (with the address we see it from); its peers learn
        it from the next state broadcast."""
        conn = self.connections.connections.get(client_id)
        if conn is None or not conn.joined:
            return
        observed = conn.remote.rpartition(":")[0].strip("[]") or conn.remote
        notice = Reachability(
            p2p_address=address,
            reachable=result.reachable,
            observed_host=observed[:255],
            detail=result.detail[:1024],
            relay_port=None if self.relay is None else self.relay.port,
        )
        conn.send(to_wire(notice))
