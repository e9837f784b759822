"""Who the server knows: clients waiting for the next epoch and where peers reach them (no I/O).

The pending set is what the coordinator is ticked with (clients that joined and were not kicked
since, in join order); the address book holds each connected client's P2P address, which goes
out with every state broadcast so peers can fetch each other's results.
"""

from __future__ import annotations

from collections.abc import Iterable


class ClientRoster:
    """The pending set and the P2P address book of the connected clients."""

    def __init__(self) -> None:
        self.pending: dict[bytes, None] = {}
        """Joined and not kicked; insertion order = join order."""
        self.p2p_addresses: dict[bytes, str] = {}
        self.without_model: set[bytes] = set()
        """Connected clients whose latest Join said they hold no weights (a restarted
        process): a P2P checkpoint cannot count on them."""
        self._kicked: set[bytes] = set()
        """Dropped records already kicked once: a later re-Join of theirs is honoured."""

    def join(self, client_id: bytes, p2p_address: str, holds_model: bool = True) -> bool:
        """Record a Join (a repeated Join updates the address and whether the client holds
        the weights); True the first time."""
        first = client_id not in self.pending
        self.pending[client_id] = None
        self.p2p_addresses[client_id] = p2p_address
        if holds_model:
            self.without_model.discard(client_id)
        else:
            self.without_model.add(client_id)
        return first

    def holders(self) -> list[bytes]:
        """The pending clients that hold the run's weights (as their latest Join said)."""
        return [client_id for client_id in self.pending if client_id not in self.without_model]

    def leave(self, client_id: bytes) -> None:
        """Forget a client that disconnected."""
        self.pending.pop(client_id, None)
        self.p2p_addresses.pop(client_id, None)
        self.without_model.discard(client_id)

    def kick(self, client_ids: Iterable[bytes]) -> list[bytes]:
        """Remove these clients from the pending set (their address stays while they are
        connected); returns the ones that were pending."""
        kicked = [client_id for client_id in client_ids if client_id in self.pending]
        for client_id in kicked:
            del self.pending[client_id]
        return kicked

    def kick_once(self, dropped_ids: Iterable[bytes]) -> list[bytes]:
        """Kick the clients of the current dropped records that were not kicked yet.

        `dropped_ids` are the ids whose exited record says a health check dropped them; a
        record stays until the next epoch starts. Each is kicked once, so a client that joins
        again after being dropped is in the next epoch (the reference kicks it at every tick,
        which locks out a run whose clients were all dropped)."""
        current = set(dropped_ids)
        self._kicked &= current
        fresh = [
            client_id for client_id in dict.fromkeys(dropped_ids) if client_id not in self._kicked
        ]
        self._kicked.update(fresh)
        return self.kick(fresh)

    def peers(self, member_ids: Iterable[bytes]) -> dict[bytes, str]:
        """P2P addresses of the given epoch members we know one for. Pending clients' are not
        handed out: the P2P layer serves and dials members only, and a broadcast listing
        every joiner would grow with a join flood (each state to each client)."""
        return {cid: self.p2p_addresses[cid] for cid in member_ids if cid in self.p2p_addresses}
