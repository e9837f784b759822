"""The state broadcast: what every joined client is sent after each change and on every tick.

`StateBroadcaster` builds the `CoordinatorState` payload (the coordinator's wire form, the P2P
addresses of the epoch's members whose reachability is known, those found unreachable and, in
a permissioned run, each delegate member's authorizer),
sends it to every joined connection and to the data server, and remembers the last one: a new
joiner gets it first, and an extra tick broadcasts only when the coordinator changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from psyche_common.coordinator import Coordinator
from psyche_common.protocol import encode_payload
from psyche_common.protocol.messages import AnyClientMessage

from .connections import ConnectionManager
from .data_server import DataServer
from .options import ServerStats
from .reachability import ReachabilityChecker
from .roster import ClientRoster


class StateBroadcaster:
    """Encodes and sends the run's state; keeps the last frame sent."""

    def __init__(
        self,
        coordinator: Coordinator,
        roster: ClientRoster,
        reachability: ReachabilityChecker,
        connections: ConnectionManager[AnyClientMessage],
        stats: ServerStats,
        data_server: DataServer | None,
        authorizers: Callable[[Iterable[bytes]], dict[bytes, bytes]] | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.roster = roster
        self.reachability = reachability
        self.connections = connections
        self.stats = stats
        self.data_server = data_server
        self.authorizers = authorizers
        """Member → authorizer of the members admitted by delegation (a permissioned run)."""
        self._last_state_frame: bytes | None = None
        self._last_wire: dict[str, Any] | None = None

    def peers(self) -> dict[bytes, str]:
        """P2P addresses of the epoch's members and mid-epoch joiners (not of other pending
        clients: `roster.peers`; a joiner follows the rounds, so the members push it their
        announcements), once the server has connected back to each (reachable or not,
        `reachability`): an address is never handed out before its verdict, so no peer dials
        a private address behind a NAT in the moment between a Join and the state that marks
        it unreachable."""
        checked = self.reachability.reachable
        es = self.coordinator.epoch_state
        members = [client.id for client in es.clients] + [j.id for j in es.joining]
        return {cid: addr for cid, addr in self.roster.peers(members).items() if cid in checked}

    def state_frame(self, wire: dict[str, Any] | None = None) -> bytes:
        """The msgpack payload of a `CoordinatorState` (each link seals it for itself)."""
        peers = self.peers()
        state: dict[str, Any] = {
            "type": "CoordinatorState",
            "coordinator": self.coordinator.to_wire() if wire is None else wire,
            "peers": peers,
            "unreachable": self.reachability.unreachable(peers),
        }
        if self.authorizers is not None:
            members = (client.id for client in self.coordinator.epoch_state.clients)
            authorizers = self.authorizers(members)
            if authorizers:  # only a run with delegates sends the field
                state["authorizers"] = authorizers
        return encode_payload(state)

    def current_frame(self) -> bytes:
        """The last state broadcast (a fresh one before the first): what a joiner gets first."""
        return self._last_state_frame or self.state_frame()

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

    def broadcast_if_changed(self) -> None:
        """Broadcast now when the coordinator changed; a change of the peer list alone (a Join)
        goes out with the next tick, as in the reference, so N joins cost no N broadcasts."""
        wire = self.coordinator.to_wire()
        if wire != self._last_wire:
            self.broadcast(wire)
