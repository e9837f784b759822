"""What a per-address cap counts a remote address as (pure: no sockets, only `ipaddress`).

A host is given a whole IPv6 /64 as easily as one IPv4 address, so a cap keyed on the exact
IPv6 address would let one host open as many connections as it has addresses. Every per-IP
cap (the server's connections and handshakes per IP, the relay's sockets and pipes per IP,
a client's P2P inbound connections per IP) counts `address_key(host)` instead:

- an IPv4 address as itself (`"203.0.113.7"`);
- an IPv4-mapped IPv6 address (`::ffff:203.0.113.7`, what a dual-stack socket reports for an
  IPv4 peer) as that IPv4 address, so one host is one key on either kind of socket;
- any other IPv6 address as its /64 (`"2001:db8:1:2::/64"`); a scoped (link-local) address
  keeps its zone (`"fe80::/64%eth0"`), since the same prefix on two links is two networks.

`peer_key` is the same for what `StreamWriter.get_extra_info("peername")` returns; a peer
that is not an IP address (a Unix socket, a test double) is counted under its own text.
"""

from __future__ import annotations

import ipaddress

IPV6_PREFIX = 64
"""The IPv6 prefix length a cap counts as one address (a typical site's subnet)."""


def address_key(host: str) -> str:
    """The key a per-IP cap counts `host` (an IP address as text) under; raises `ValueError`
    naming `host` when it is not an IPv4 or IPv6 address."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"not an IP address: {host!r}") from None
    if isinstance(address, ipaddress.IPv4Address):
        return str(address)
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    zone = address.scope_id
    unscoped = ipaddress.IPv6Address(address.packed)
    network = ipaddress.IPv6Network((unscoped, IPV6_PREFIX), strict=False)
    return f"{network}%{zone}" if zone else str(network)


def peer_key(peername: object) -> str:
    """`address_key` of a socket's `peername` (`(host, port, ...)`); a peer that is not an
    IP address is counted under its own text (`str(peername)`, or its host's)."""
    host = peername[0] if isinstance(peername, tuple) and peername else peername
    try:
        return address_key(str(host))
    except ValueError:
        return str(host)
