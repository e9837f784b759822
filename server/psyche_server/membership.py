"""Who is in the run: each client connection's way from the handshake to a Join and out again.

`Membership` owns the connection-side events of a client: the pre-join timeout (`--pre-join-
timeout`), the Join (the run id, admission under `--authorized-keys`, keys banned on proof
refused, the first state frame,
the reachability probe of its P2P address, the pending set), the notices sent to one client
(its reachability verdict, a weights-hash mismatch), a reload of the authorized keys (the keys
it removed leave the pending set, and their connections close once they are no members of the
epoch; a file that does not load removes nobody), and a disconnect (forgotten everywhere, withdrawn from the coordinator).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.errors import CoordinatorError
from psyche_common.protocol import short_id
from psyche_common.protocol.messages import Join, Reachability, Rejected, WeightsMismatch, to_wire

from .admission import Admission
from .connections import CloseConnection, Connection
from .consistency import WeightsHashMonitor
from .options import ServerOptions
from .reachability import ProbeResult, ReachabilityChecker
from .relay import RelayServer
from .roster import ClientRoster

log = logging.getLogger("psyche.server")


class Membership:
    """Handles a client's connect, Join, notices, revocation and disconnect."""

    def __init__(
        self,
        coordinator: Coordinator,
        options: ServerOptions,
        roster: ClientRoster,
        connections: Mapping[bytes, Connection],
        reachability: ReachabilityChecker,
        admission: Admission | None,
        weights: WeightsHashMonitor,
        relay: RelayServer | None,
        current_frame: Callable[[], bytes],
    ) -> None:
        self.coordinator = coordinator
        self.options = options
        self.roster = roster
        self.connections = connections
        """The joined and joining connections by client id (`ConnectionManager.connections`)."""
        self.reachability = reachability
        self.admission = admission
        self.weights = weights
        self.relay = relay
        self._current_frame = current_frame
        self.revoked: set[bytes] = set()
        """Members whose key a reload removed: closed when they leave the epoch."""

    @property
    def run_id(self) -> str:
        return self.coordinator.run_id

    # ------------------------------------------------------------------ connect / disconnect

    def on_connect(self, conn: Connection) -> None:
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

    def on_disconnect(self, conn: Connection) -> None:
        client_id = conn.peer_id
        self.roster.leave(client_id)
        self.revoked.discard(client_id)
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

    def may_use_relay(self, client_id: bytes) -> bool:
        """Only clients connected here and joined may open relay pipes (or be reached)."""
        conn = self.connections.get(client_id)
        return conn is not None and conn.joined

    def in_epoch(self, client_id: bytes) -> bool:
        """Whether `client_id` is a member of the current epoch (relay pipes join members)."""
        return any(client.id == client_id for client in self.coordinator.epoch_state.clients)

    # ------------------------------------------------------------------ join

    def on_join(self, conn: Connection, message: Join) -> None:
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
        ban = self.coordinator.verification.bans.get(client_id)
        if ban is not None:  # convicted on proof: no later epoch would ever seat it
            reason = (
                f"banned from this run: convicted at step {ban.step} of epoch {ban.epoch} on "
                f"proof ({ban.kind.value})"
            )
            log.warning(
                "refusing the Join of %s: %s",
                short_id(client_id),
                reason,
                extra={"client": short_id(client_id), "reason": reason},
            )
            raise CloseConnection(reason)
        if not conn.joined:
            conn.joined = True  # from now on it gets every state, starting with the current one
            conn.send_frame(self._current_frame())
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

    # ------------------------------------------------------------------ notices to one client

    def tell_reachability(self, client_id: bytes, address: str, result: ProbeResult) -> None:
        """A probe ended: tell the client (with the address we see it from); its peers learn
        it from the next state broadcast."""
        conn = self.connections.get(client_id)
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

    def tell_divergent(self, client_id: bytes, step: int, majority: bytes) -> None:
        """Tell a client that its weights at `step` are not the majority's (it resyncs)."""
        conn = self.connections.get(client_id)
        if conn is not None:
            conn.send(to_wire(WeightsMismatch(step=step, majority_hash=majority)))

    # ------------------------------------------------------------------ authorized keys

    def reload_authorized_keys(self, force: bool = True) -> bool:
        """Re-read `--authorized-keys` (force: now, as on SIGHUP; else when the file changed
        and then stayed unchanged for a poll interval); clients it no longer admits leave the
        pending set, and are closed at once unless they are members of the current epoch (then
        when they stop being members). A file that does not load revokes nobody (new Joins are
        refused until it does: `Admission.admit`). True when the list was replaced."""
        if self.admission is None:
            return False
        keys = self.admission.keys
        if not (keys.reload() if force else keys.reload_if_changed()):
            return False
        joined = [cid for cid, conn in self.connections.items() if conn.joined]
        for client_id in self.admission.revoked(joined):
            self.roster.kick([client_id])
            self.revoked.add(client_id)
        self.close_revoked()
        return True

    def close_revoked(self) -> None:
        """Close the connections of revoked clients that are not epoch members (any more)."""
        if not self.revoked:
            return
        members = {client.id for client in self.coordinator.epoch_state.clients}
        for client_id in [cid for cid in self.revoked if cid not in members]:
            self.revoked.discard(client_id)
            conn = self.connections.get(client_id)
            if conn is None:
                continue
            reason = "not authorized: this key was removed from the server's authorized keys"
            log.warning("closing %s: %s", conn, reason, extra={"client": short_id(client_id)})
            conn.send(to_wire(Rejected(reason=reason)))
            conn.close(reason)
