"""The lab itself: a NATted host reaches public hosts but is unreachable from them, a rate
limit holds, a cut link drops traffic until healed, and nothing is left behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.harness.netlab import plan
from bench.harness.netlab.lab import Lab
from bench.harness.netlab.shell import namespaces, remove_stale, run

pytestmark = pytest.mark.timeout(120)

PROBE = [sys.executable, str(Path(__file__).with_name("probe.py"))]
PORT = "7000"


def send(lab: Lab, host: str, address: str, nbytes: int) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(
        lab.run(host, *PROBE, "send", address, PORT, str(nbytes), timeout=90)
    )
    return result


def start_listeners(lab: Lab, *hosts: str) -> None:
    for host in hosts:
        lab.popen(host, [*PROBE, "listen", PORT], stdout=subprocess.DEVNULL)
    time.sleep(1.0)


def test_nat_is_outbound_only(netlab: Lab) -> None:
    server = netlab.add_host("srv")
    natted = netlab.add_natted_host("nat")
    start_listeners(netlab, "srv", "nat")
    out = send(netlab, "nat", server.address, 100_000)
    assert out["connected"] and out["received"] == 100_000, out
    assert not send(netlab, "srv", natted.address, 10)["connected"]
    assert natted.public_address is not None
    refused = send(netlab, "srv", natted.public_address, 10)  # the router's WAN address
    assert not refused["connected"], refused


def test_a_port_forward_opens_one_port(netlab: Lab) -> None:
    netlab.add_host("srv")
    natted = netlab.add_natted_host("nat")
    start_listeners(netlab, "nat")
    outside = netlab.forward_port("nat", int(PORT))
    assert outside == f"{natted.public_address}:{PORT}"
    assert send(netlab, "srv", natted.public_address or "", 10)["connected"]


def test_rate_limits_and_cuts(netlab: Lab) -> None:
    server = netlab.add_host("srv")
    netlab.add_host("pub")
    start_listeners(netlab, "srv")
    fast = send(netlab, "pub", server.address, 2_000_000)
    netlab.limit_egress("pub", 5)
    slow = send(netlab, "pub", server.address, 2_000_000)
    assert 3.0 < slow["mbit"] < 6.5, slow  # 5 Mbit/s, give or take the burst
    assert fast["mbit"] > 3 * slow["mbit"], (fast, slow)
    netlab.cut("pub", "srv")
    assert not send(netlab, "pub", server.address, 10)["connected"]
    netlab.heal("pub", "srv")
    assert send(netlab, "pub", server.address, 10)["connected"]


def test_everything_is_removed_also_after_a_failure(netlab_available: None) -> None:
    with pytest.raises(RuntimeError), Lab() as lab:
        lab.add_host("a")
        lab.add_natted_host("b")
        sleeper = lab.popen("a", ["sleep", "600"])
        assert {lab.switch, lab.hosts["a"].namespace} <= set(namespaces())
        raise RuntimeError("a failing test")
    assert sleeper.poll() is not None
    assert not [name for name in namespaces() if name.startswith(plan.PREFIX + lab.lab_id)]


def test_only_labs_of_dead_processes_are_stale(netlab_available: None) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    with Lab() as live:
        orphan = f"{plan.PREFIX}{plan.new_lab_id(dead.pid)}_sw"
        run(["ip", "netns", "add", orphan])
        assert remove_stale() == [orphan]
        assert live.switch in namespaces()


def test_plan_is_pure_and_private() -> None:
    host = plan.natted_host("abc123", "nat", 3)
    assert host.address == "10.213.3.2" and host.seen_as == "10.213.0.203"
    assert plan.public_host("abc123", "srv", 1).seen_as == "10.213.0.1"
    assert plan.collides_with("10.213.5.0/24 dev x") and not plan.collides_with("10.2.0.0/16")
    with pytest.raises(ValueError):
        plan.validate_name("Bad-Name")
    assert plan.tbf_args(5)[:3] == ["tbf", "rate", "5mbit"]
    assert plan.owner_pid(plan.switch_namespace(plan.new_lab_id(4242))) == 4242
    assert plan.owner_pid("nlab-other") is None and plan.owner_pid("netns1") is None
