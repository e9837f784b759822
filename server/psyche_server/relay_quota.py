"""The relay's bounds (`RelayLimits`) and its pipe quota (`PipeQuota`), pure bookkeeping.

A pipe counts from the moment it is asked for (`RelayDial`), not from the moment both ends
are there: a dial waiting for its second end holds a slot like an open pipe, so a host cannot
hold thousands of dials that never complete. Each pipe (open or pending) counts

- once in the total (`max_pipes`),
- for its dialer's outgoing pipes and, apart, for its target's incoming pipes
  (`max_pipes_per_client` each way: pipes others dial to a client never use up the pipes it
  may dial itself),
- for the pair of keys it joins (`max_pipes_per_pair`: one dialer key holds at most that many
  of a target's incoming pipes, from however many addresses),
- for the address its dialer connects from (`max_pipes_per_ip`; the caller passes the
  address's `psyche_common.address_key`, so an IPv6 /64 counts as one address), and
- for that address and its target together (`max_pipes_per_ip_to_client`),

so one host, whatever number of keys it holds, can neither fill the relay nor a victim's
per-key quota: it holds at most `max_pipes_per_ip` of the relay's pipes and at most
`max_pipes_per_ip_to_client` of any one client's; and one key, from however many addresses,
holds at most `max_pipes_per_pair` of a victim's incoming pipes and none of its outgoing ones.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TypeVar

from psyche_common.protocol import short_id

_K = TypeVar("_K")


@dataclass(frozen=True)
class RelayLimits:
    """Bounds of the relay port (`psyche-server run --relay-*` sets some of them)."""

    max_mbps: float | None = 100.0
    """Bytes forwarded per second over all pipes, both directions together, in Mbit/s
    (None: no cap)."""
    max_pipes: int = 1024
    max_pipes_per_client: int = 64
    """Pipes one client dials (open or pending), and apart, pipes dialed to it."""
    max_pipes_per_pair: int = 8
    """Pipes (open or pending) from one dialer key to one target key."""
    max_pipes_per_ip: int = 128
    """Pipes (open or pending) whose dialer connects from one address (`--relay-max-pipes-per-ip`)."""
    max_pipes_per_ip_to_client: int = 16
    """Pipes (open or pending) from one address to one client."""
    max_connections: int = 4096
    max_connections_per_ip: int = 256
    """Relay sockets from one address, whatever they are for (`--relay-max-connections-per-ip`)."""
    handshake_timeout: float = 10.0
    accept_timeout: float = 10.0
    """Longest a dialer waits for the peer's end of the pipe."""
    listen_idle_timeout: float = 90.0
    """A listen channel with no frame this long is closed (clients ping every 20 s)."""
    pipe_idle_timeout: float = 300.0
    """A pipe with no byte in either direction this long is closed."""


@dataclass(frozen=True)
class PipeClaim:
    """One pipe's slot in the quota: who dials whom, from which address."""

    dialer: bytes
    target: bytes
    ip: str


class PipeQuota:
    """Counts the relay's pipes, open or pending (see the module docstring)."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self.total = 0
        self._outgoing: Counter[bytes] = Counter()
        self._incoming: Counter[bytes] = Counter()
        self._per_pair: Counter[tuple[bytes, bytes]] = Counter()
        self._per_ip: Counter[str] = Counter()
        self._per_ip_target: Counter[tuple[str, bytes]] = Counter()

    def of_key(self, key: bytes) -> int:
        """Pipes `key` is an end of (open or pending)."""
        return self._outgoing[key] + self._incoming[key]

    def of_ip(self, ip: str) -> int:
        """Pipes dialed from `ip` (open or pending)."""
        return self._per_ip[ip]

    def refusal(self, dialer: bytes, target: bytes, ip: str) -> str | None:
        """Why one more pipe from `dialer` at `ip` to `target` does not fit (None: it fits);
        the reason names the limit and the flag that sets it."""
        limits = self.limits
        if self.total >= limits.max_pipes:
            return f"{self.total} relay pipes open or pending (the server's limit)"
        if self._per_ip[ip] >= limits.max_pipes_per_ip:
            return (
                f"{self._per_ip[ip]} relay pipes open or pending from {ip} "
                f"(--relay-max-pipes-per-ip {limits.max_pipes_per_ip})"
            )
        if self._per_ip_target[ip, target] >= limits.max_pipes_per_ip_to_client:
            return (
                f"{self._per_ip_target[ip, target]} relay pipes open or pending from {ip} to "
                f"{short_id(target)} (at most {limits.max_pipes_per_ip_to_client} from one "
                "address to one client)"
            )
        if self._per_pair[dialer, target] >= limits.max_pipes_per_pair:
            return (
                f"{short_id(dialer)} has {self._per_pair[dialer, target]} relay pipes open or "
                f"pending to {short_id(target)} (at most {limits.max_pipes_per_pair} from one "
                "client to one client)"
            )
        for end, counter, way in (
            (dialer, self._outgoing, "dialed by"),
            (target, self._incoming, "dialed to"),
        ):
            if counter[end] >= limits.max_pipes_per_client:
                return (
                    f"{counter[end]} relay pipes open or pending {way} {short_id(end)} "
                    f"(the per-client limit of {limits.max_pipes_per_client})"
                )
        return None

    def claim(self, dialer: bytes, target: bytes, ip: str) -> PipeClaim:
        """Take a slot (after `refusal` said it fits)."""
        self.total += 1
        self._outgoing[dialer] += 1
        self._incoming[target] += 1
        self._per_pair[dialer, target] += 1
        self._per_ip[ip] += 1
        self._per_ip_target[ip, target] += 1
        return PipeClaim(dialer, target, ip)

    def release(self, claim: PipeClaim) -> None:
        """Give a slot back (the dial failed or the pipe closed)."""
        self.total -= 1
        _decrement(self._outgoing, claim.dialer)
        _decrement(self._incoming, claim.target)
        _decrement(self._per_pair, (claim.dialer, claim.target))
        _decrement(self._per_ip, claim.ip)
        _decrement(self._per_ip_target, (claim.ip, claim.target))


def _decrement(counter: Counter[_K], key: _K) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
