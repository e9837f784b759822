"""Pure naming and addressing of a lab: every name carries the lab's unique prefix, every
address is in 10.213.0.0/16 (chosen so that it cannot collide with the host's networks, which
the lab checks before building anything).

Layout: the switch namespace holds the bridge; public hosts get 10.213.0.<n>/24 on it; the NAT
router of NATted host k gets 10.213.0.<200+k>/24 on the switch and 10.213.<k>.1/24 on its LAN,
where the host is 10.213.<k>.2/24.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

PREFIX = "nlab"
"""Every namespace of every lab starts with this (stale ones are removed by it)."""
SUBNET = "10.213.0.0/16"
SWITCH_NET = "10.213.0"
MAX_PUBLIC_HOSTS = 199
MAX_NAT_HOSTS = 50


def new_lab_id(pid: int) -> str:
    """An id that makes this lab's names unique on the machine: the pid of the process that
    owns the lab (so stale labs of dead processes can be told apart) and a random part."""
    return f"{pid}x{secrets.token_hex(3)}"


def owner_pid(namespace: str) -> int | None:
    """The pid in a lab namespace's name (`new_lab_id`), or None for other names."""
    if not namespace.startswith(PREFIX):
        return None
    head, sep, _ = namespace[len(PREFIX) :].partition("x")
    return int(head) if sep and head.isdigit() else None


@dataclass(frozen=True)
class HostPlan:
    """One host of the lab: its namespace, its address and, when NATted, its router."""

    name: str
    namespace: str
    address: str
    """The host's own address (a private LAN address when NATted)."""
    router_namespace: str | None = None
    public_address: str | None = None
    """Where the host's traffic appears from on the switch (its router's WAN address)."""
    lan_gateway: str | None = None

    @property
    def natted(self) -> bool:
        return self.router_namespace is not None

    @property
    def seen_as(self) -> str:
        return self.public_address or self.address


def switch_namespace(lab_id: str) -> str:
    return f"{PREFIX}{lab_id}_sw"


def public_host(lab_id: str, name: str, index: int) -> HostPlan:
    """Public host number `index` (1-based) named `name`."""
    if not 1 <= index <= MAX_PUBLIC_HOSTS:
        raise ValueError(f"a lab holds at most {MAX_PUBLIC_HOSTS} public hosts")
    return HostPlan(name, f"{PREFIX}{lab_id}-{name}", f"{SWITCH_NET}.{index}")


def natted_host(lab_id: str, name: str, index: int) -> HostPlan:
    """NATted host number `index` (1-based) named `name`, behind its own router."""
    if not 1 <= index <= MAX_NAT_HOSTS:
        raise ValueError(f"a lab holds at most {MAX_NAT_HOSTS} NATted hosts")
    return HostPlan(
        name,
        f"{PREFIX}{lab_id}-{name}",
        f"10.213.{index}.2",
        router_namespace=f"{PREFIX}{lab_id}_r{index}",
        public_address=f"{SWITCH_NET}.{200 + index}",
        lan_gateway=f"10.213.{index}.1",
    )


def validate_name(name: str) -> None:
    """Host names become part of namespace names: short, lowercase letters and digits."""
    if not (name.isascii() and name.isalnum() and name.islower() and 1 <= len(name) <= 12):
        raise ValueError(f"lab host name {name!r}: 1-12 lowercase letters or digits")


def collides_with(routes: str) -> bool:
    """Whether the host's `ip -4 route` output already uses a 10.213.x.x network."""
    return any(word.startswith("10.213.") for line in routes.splitlines() for word in line.split())


def tbf_args(mbit: float) -> list[str]:
    """`tc qdisc ... tbf` arguments for an egress limit of `mbit` Mbit/s (burst of ~10 ms,
    never under 16 KiB so small rates still pass full-size packets)."""
    if mbit <= 0:
        raise ValueError(f"rate limit must be positive, got {mbit} Mbit/s")
    burst = max(16 * 1024, int(mbit * 1e6 / 8 / 100))
    return ["tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", "200ms"]
