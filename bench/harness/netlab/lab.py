"""`Lab`: a small network built from Linux network namespaces, for tests.

A "switch" namespace holds a bridge. A public host is a namespace with one veth to the switch
(10.213.0.n). A NATted host sits behind its own router namespace: the router's WAN leg is on
the switch, its LAN leg faces the host, it MASQUERADEs the host's outbound traffic and drops
every inbound NEW connection (a home connection: outbound only). On top of that: per-host
egress/ingress rate limits (`tc tbf`), link cuts between two hosts (iptables DROP both ways),
and commands or processes run inside a host (`ip netns exec`).

Use it as a context manager (or through the `netlab` fixture): everything it made — processes
it started, namespaces and with them their veths — is removed on exit, also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from . import plan
from .plan import HostPlan
from .shell import LabError, in_ns, run


class Lab:
    """One lab: `add_host` / `add_natted_host`, then `popen`/`run` inside them."""

    def __init__(self, lab_id: str | None = None) -> None:
        self.lab_id = lab_id or plan.new_lab_id(os.getpid())
        self.switch = plan.switch_namespace(self.lab_id)
        self.hosts: dict[str, HostPlan] = {}
        self._namespaces: list[str] = []
        self._processes: list[subprocess.Popen[Any]] = []
        self._public = 0
        self._natted = 0

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Lab:
        try:
            self.build_switch()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def build_switch(self) -> None:
        if plan.collides_with(run(["ip", "-4", "route"], check=False)):
            raise LabError(f"this machine already routes {plan.SUBNET}: the lab would collide")
        self._add_namespace(self.switch)
        self._ip(self.switch, "link", "add", "br0", "type", "bridge")
        self._ip(self.switch, "link", "set", "br0", "up")

    def close(self) -> None:
        """Stop the processes started in the lab, then delete its namespaces (and veths)."""
        for proc in self._processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._processes:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for namespace in reversed(self._namespaces):
            for pid in run(["ip", "netns", "pids", namespace], check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)  # a process our own process started
            run(["ip", "netns", "delete", namespace], check=False)
        self._namespaces.clear()

    # ---- topology ----------------------------------------------------------------------------

    def add_host(self, name: str) -> HostPlan:
        """A public host on the switch: reachable by every other host."""
        self._check_new(name)
        self._public += 1
        host = plan.public_host(self.lab_id, name, self._public)
        self._add_namespace(host.namespace)
        self._wire(self.switch, f"p{self._public}", host.namespace, "eth0", bridge=True)
        self._ip(host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        self._ip(host.namespace, "link", "set", "eth0", "up")
        # on-link default route: the host's primary address is its switch address (programs
        # that pick "the interface of the default route" find eth0, not loopback)
        self._ip(host.namespace, "route", "add", "default", "dev", "eth0")
        self.hosts[name] = host
        return host

    def add_natted_host(self, name: str) -> HostPlan:
        """A host behind its own NAT router: it can open connections to public hosts (they
        see the router's address); nobody can open one to it."""
        self._check_new(name)
        self._natted += 1
        index = self._natted
        host = plan.natted_host(self.lab_id, name, index)
        router = host.router_namespace
        assert router is not None and host.public_address and host.lan_gateway
        self._add_namespace(router)
        self._add_namespace(host.namespace)
        self._wire(self.switch, f"w{index}", router, "wan", bridge=True)
        self._ip(router, "addr", "add", f"{host.public_address}/24", "dev", "wan")
        self._ip(router, "link", "set", "wan", "up")
        self._wire(router, "lan", host.namespace, "eth0", bridge=False)
        self._ip(router, "addr", "add", f"{host.lan_gateway}/24", "dev", "lan")
        self._ip(router, "link", "set", "lan", "up")
        self._ip(host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        self._ip(host.namespace, "link", "set", "eth0", "up")
        self._ip(host.namespace, "route", "add", "default", "via", host.lan_gateway)
        run(in_ns(router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"))
        for rule in (
            ["-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"],
            ["-A", "FORWARD", "-i", "wan", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"],
            ["-A", "INPUT", "-i", "wan", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"],
        ):
            run(in_ns(router, "iptables", *rule))
        self.hosts[name] = host
        return host

    def forward_port(self, name: str, port: int) -> str:
        """Forward TCP `port` of NATted host `name`'s router to the host (a home router's
        port forward); returns the outside `address:port` peers can then dial."""
        host = self.hosts[name]
        router = host.router_namespace
        if router is None or host.public_address is None:
            raise ValueError(f"lab host {name!r} is not behind NAT")
        target = f"{host.address}:{port}"
        for rule in (
            ["-t", "nat", "-A", "PREROUTING", "-i", "wan", "-p", "tcp", "--dport", str(port),
             "-j", "DNAT", "--to-destination", target],
            ["-I", "FORWARD", "-i", "wan", "-p", "tcp", "-d", host.address, "--dport",
             str(port), "-j", "ACCEPT"],
        ):  # fmt: skip
            run(in_ns(router, "iptables", *rule))
        return f"{host.public_address}:{port}"

    def limit_egress(self, name: str, mbit: float) -> None:
        """Cap what `name` sends (its uplink) at `mbit` Mbit/s."""
        self._tbf(self.hosts[name].namespace, "eth0", mbit)

    def limit_ingress(self, name: str, mbit: float) -> None:
        """Cap what `name` receives (its downlink) at `mbit` Mbit/s: shaped on the port that
        faces it (the switch port, or its router's LAN leg)."""
        host = self.hosts[name]
        if host.router_namespace is not None:
            self._tbf(host.router_namespace, "lan", mbit)
        else:
            index = int(host.address.rsplit(".", 1)[1])
            self._tbf(self.switch, f"p{index}", mbit)

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts `a` and `b` (both ways, on both hosts)."""
        self._filter(a, b, "-A")

    def heal(self, a: str, b: str) -> None:
        """Undo `cut(a, b)`."""
        self._filter(a, b, "-D")

    # ---- running things inside a host --------------------------------------------------------

    def command(self, name: str, args: Sequence[str]) -> list[str]:
        """`args` as a command line that runs inside host `name`."""
        return in_ns(self.hosts[name].namespace, *args)

    def run(self, name: str, *args: str, check: bool = True, timeout: float = 20.0) -> str:
        """Run a command inside host `name`; its stdout."""
        return run(self.command(name, args), check=check, timeout=timeout)

    def popen(
        self, name: str, args: Sequence[str], *, log: Path | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start a process inside host `name` (stopped at teardown); stdout and stderr go to
        `log` when given."""
        if log is not None:
            handle = log.open("wb")
            kwargs.setdefault("stdout", handle)
            kwargs.setdefault("stderr", subprocess.STDOUT)
        proc: subprocess.Popen[Any] = subprocess.Popen(self.command(name, args), **kwargs)
        self._processes.append(proc)
        return proc

    def processes(self) -> Iterator[subprocess.Popen[Any]]:
        return iter(self._processes)

    # ---- helpers -----------------------------------------------------------------------------

    def _check_new(self, name: str) -> None:
        plan.validate_name(name)
        if name in self.hosts:
            raise ValueError(f"the lab already has a host named {name!r}")

    def _add_namespace(self, namespace: str) -> None:
        run(["ip", "netns", "add", namespace])
        self._namespaces.append(namespace)
        self._ip(namespace, "link", "set", "lo", "up")

    def _ip(self, namespace: str, *args: str) -> None:
        run(["ip", "-n", namespace, *args])

    def _wire(self, ns_a: str, if_a: str, ns_b: str, if_b: str, *, bridge: bool) -> None:
        """A veth pair: `if_a` in `ns_a` (put on its bridge when `bridge`), `if_b` in `ns_b`."""
        run(["ip", "link", "add", if_a, "netns", ns_a, "type", "veth", "peer", "name", if_b,
             "netns", ns_b])  # fmt: skip
        if bridge:
            self._ip(ns_a, "link", "set", if_a, "master", "br0")
        self._ip(ns_a, "link", "set", if_a, "up")

    def _tbf(self, namespace: str, device: str, mbit: float) -> None:
        run(in_ns(namespace, "tc", "qdisc", "replace", "dev", device, "root", *plan.tbf_args(mbit)))

    def _filter(self, a: str, b: str, action: str) -> None:
        first, second = self.hosts[a], self.hosts[b]
        for host, other in ((first, second), (second, first)):
            for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
                run(in_ns(host.namespace, "iptables", action, chain, flag, other.seen_as,
                          "-j", "DROP"))  # fmt: skip
