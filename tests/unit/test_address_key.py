"""`psyche_common.address_key`: what a per-IP cap counts (an IPv6 /64 is one address), and
the caps that count with it (the relay's sockets and pipes per IP)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from psyche_common.address_key import address_key, peer_key
from psyche_server.relay import RelayServer
from psyche_server.relay_quota import PipeQuota, RelayLimits


def test_an_ipv4_address_is_itself() -> None:
    assert address_key("203.0.113.7") == "203.0.113.7"
    assert address_key("203.0.113.8") != address_key("203.0.113.7")


def test_an_ipv4_mapped_address_is_its_ipv4_address() -> None:
    assert address_key("::ffff:203.0.113.7") == "203.0.113.7"
    assert address_key("::ffff:cb00:7107") == "203.0.113.7"


def test_two_ipv6_addresses_of_one_64_share_a_key() -> None:
    first = address_key("2001:db8:1:2::1")
    assert first == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:2:ffff:ffff:ffff:ffff") == first
    assert address_key("2001:DB8:1:2:abcd::9") == first


def test_different_64s_do_not_share_a_key() -> None:
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("2001:db8:1:3::1") == "2001:db8:1:3::/64"


def test_link_local_keeps_its_zone() -> None:
    assert address_key("fe80::1%eth0") == "fe80::/64%eth0"
    assert address_key("fe80::2%eth0") == "fe80::/64%eth0"
    assert address_key("fe80::1%eth1") != address_key("fe80::1%eth0")
    assert address_key("fe80::1") == "fe80::/64"


@pytest.mark.parametrize("text", ["", "example.org", "1.2.3", "2001:db8::1::2", "1.2.3.4/24"])
def test_malformed_input_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match=f"not an IP address: {text!r}"):
        address_key(text)


def test_peer_key_of_a_socket_peername() -> None:
    assert peer_key(("203.0.113.7", 4000)) == "203.0.113.7"
    assert peer_key(("2001:db8:1:2::5", 4000, 0, 0)) == "2001:db8:1:2::/64"
    assert peer_key(("::ffff:203.0.113.7", 4000, 0, 0)) == "203.0.113.7"
    assert peer_key("/run/psyche.sock") == "/run/psyche.sock"  # not an IP: its own text
    assert peer_key(None) == "None"


@dataclass
class _Transport:
    aborted: bool = False

    def abort(self) -> None:
        self.aborted = True


@dataclass(eq=False)
class _Writer:
    """What `RelayServer._admit` reads of a socket: its peer's address, and an abort."""

    host: str
    transport: _Transport = field(default_factory=_Transport)

    def get_extra_info(self, name: str) -> object:
        return (self.host, 4000, 0, 0) if name == "peername" else None


def test_relay_sockets_of_one_64_share_the_per_ip_cap() -> None:
    relay = RelayServer("run", lambda _key: True, RelayLimits(max_connections_per_ip=2))
    first, second = _Writer("2001:db8:1:2::1"), _Writer("2001:db8:1:2::2")
    assert relay._admit(first) == relay._admit(second) == "2001:db8:1:2::/64"  # type: ignore[arg-type]
    third = _Writer("2001:db8:1:2:ffff::3")  # a third address of the same /64: over the cap
    assert relay._admit(third) is None  # type: ignore[arg-type]
    assert third.transport.aborted
    other = _Writer("2001:db8:1:3::1")  # another /64 has its own count
    assert relay._admit(other) == "2001:db8:1:3::/64"  # type: ignore[arg-type]
    assert relay._admit(_Writer("::ffff:203.0.113.7")) == "203.0.113.7"  # type: ignore[arg-type]


def test_relay_pipes_of_one_64_share_the_per_ip_quota() -> None:
    quota = PipeQuota(RelayLimits(max_pipes_per_ip=1))
    dialer, other_dialer, target = b"d" * 32, b"e" * 32, b"t" * 32
    quota.claim(dialer, target, address_key("2001:db8:1:2::1"))
    refusal = quota.refusal(other_dialer, target, address_key("2001:db8:1:2::99"))
    assert refusal is not None and "2001:db8:1:2::/64" in refusal
    assert quota.refusal(other_dialer, target, address_key("2001:db8:1:3::1")) is None
