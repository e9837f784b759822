"""Coordinator server benchmark; prints exactly one JSON object on stdout.

A real `psyche-server run` subprocess on loopback (uvloop, 500 ms ticks) with N connected
protocol clients in this process. The server sends states only to connections that joined
(and closes the others after `--pre-join-timeout`), so every client joins, right after its
handshake. The first `min(N, members)` clients join first and the run enters a long Warmup
with them as its members (an epoch holds at most 256); then the others join and stay pending:
they get every state, which lists only the members as peers (the P2P layer serves and dials
members only). Every client advertises the P2P address of a stub listener of its own in this
process that answers the server's reachability probe as that client's P2P listener would (a
`Challenge`, then a `Proof` of the client's key for the `Probe`), so the states carry no
unreachable list. Measured per N, once every client (member or pending) holds a Warmup state
whose members are exactly the first clients and whose peers are exactly those members, all
probed:
- `bytes_per_broadcast`: size of one state frame as received;
- `broadcast_latency_ms`: a member sends a warmup witness (which changes the state, so the
  server ticks and broadcasts at once); latency = time from that send until each client holds
  the new state (p50 / p99 / max over clients, median over several probes);
- `server_cpu_ms_per_tick`: the server process's user+system CPU over an idle window divided by
  the broadcasts received in it (one per tick).
Baseline: the same measurements with 16 clients in the same run; `ratios_vs_baseline` divides.
`cpu_us_per_added_connection`: the CPU per tick a size costs beyond the baseline, per
connection beyond the baseline's (one state sealed and sent). `goals` says per size whether
the server's goals hold (they are set for 1,000 connections: latency p99 under 100 ms, CPU
per tick at most 10x the baseline's); `load_average` is `os.getloadavg()` before and after,
since the figures depend on what else runs.
The latency includes this process reading every socket in turn (one Python event loop for all
clients), so it is an upper bound on what the server alone adds. CPU comes from the kernel's
per-thread `schedstat` (nanoseconds) over ~10 server ticks (4 in `--quick`).

`--quick` (what `make test` runs): 40 clients of which 24 are members (so 16 pending, as at
1,000) against the baseline, 2 probes, a 2 s idle window: the same settle path in seconds.

Usage: .venv/bin/python bench/server.py [--sizes 256,1000] [--members 256] [--probes 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w
from psyche_common.coordinator import RunState
from psyche_common.coordinator.committee import WitnessProof
from psyche_common.coordinator.types import Witness
from psyche_common.protocol import (
    CONTROL_DECODE,
    HANDSHAKE_FRAME_SIZE,
    Identity,
    ProtocolError,
    connect_handshake,
    coordinator_domain,
    decode_payload,
    read_frame,
    write_frame,
)
from psyche_common.protocol.handshake import new_challenge, probe_transcript
from psyche_common.protocol.messages import Join, WarmupWitness, to_wire
from psyche_common.protocol.secure_channel import TAG_SIZE

BASELINE_CLIENTS = 16
MAX_MEMBERS = 256  # the coordinator's cap on an epoch's clients
LATENCY_P99_GOAL_MS = 100.0
CPU_RATIO_GOAL = 10.0
QUICK_MEMBERS = 24  # --quick: fewer members than clients, so some stay pending as at 1,000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def state_document(members: int) -> dict[str, Any]:
    return {
        "run_id": "bench",
        "run_state": "WaitingForMembers",
        "config": {
            "warmup_time": 3600,
            "cooldown_time": 5,
            "max_round_train_time": 10,
            "round_witness_time": 2,
            "epoch_time": 7200,
            "waiting_for_members_extra_time": 1,
            "total_steps": 1000,
            "init_min_clients": members,
            "min_clients": 1,
            "witness_nodes": 0,
            "verification_percent": 0,
            "global_batch_size_start": 256,
            "global_batch_size_end": 256,
            "global_batch_size_warmup_tokens": 0,
        },
        "model": {
            "LLM": {
                "architecture": "HfLlama",
                "data_type": "Pretraining",
                "max_seq_len": 128,
                "cold_start_warmup_steps": 0,
                "data_location": "Dummy",
                "checkpoint": {"Dummy": {"repo_id": "dummy"}},
                "lr_schedule": {
                    "Constant": {"base_lr": 1e-4, "warmup_steps": 0, "warmup_init_lr": 0.0}
                },
                "optimizer": "Dummy",
            }
        },
    }


def process_cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` (nanosecond `schedstat`, else 10 ms `stat` ticks)."""
    try:
        total_ns = sum(
            int(task.joinpath("schedstat").read_text().split()[0])
            for task in Path(f"/proc/{pid}/task").iterdir()
        )
        return total_ns / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def start_p2p_stub(identity: Identity) -> tuple[asyncio.Server, str]:
    """A listener that answers the server's reachability probe as the P2P listener of
    `identity` does: a `Challenge`, then, for the `Probe`, a `Proof` of the key."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            mine = new_challenge()
            await write_frame(
                writer, {"type": "Challenge", "challenge": mine, "ephemeral": new_challenge()}
            )
            probe = await read_frame(reader, HANDSHAKE_FRAME_SIZE, 30, CONTROL_DECODE)
            theirs = probe["challenge"]
            signed = probe_transcript(mine, theirs, identity.public_key)
            proof = {"type": "Proof", "public_key": identity.public_key}
            await write_frame(writer, {**proof, "signature": identity.sign(signed)})
            await reader.read()  # until the probe closes
        except (OSError, ProtocolError, TimeoutError, KeyError, TypeError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"127.0.0.1:{port}"


class BenchClient:
    """One protocol client: joins right after its handshake and records the states it gets.

    Until `settled` it decodes every frame to see whether the run has settled (`Warmup` whose
    members and peers are exactly `member_ids`, none unreachable); after that it only
    timestamps frames (decoding them would delay reading the other sockets)."""

    def __init__(self, port: int, member_ids: set[bytes]) -> None:
        self.port = port
        self.p2p_address = ""
        self.member_ids = member_ids
        """The run's members (shared by every client of a size; filled before they join)."""
        self.identity = Identity.generate()
        self.stub: asyncio.Server | None = None
        self.frames = 0
        self.last: bytes = b""
        self.changed_at: list[float] = []  # receipt times of frames that differ from the last
        self.bytes_last = 0
        self.settled = False
        self.task: asyncio.Task[None] | None = None

    async def connect_and_join(self) -> None:
        self.stub, self.p2p_address = await start_p2p_stub(self.identity)
        reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.channel = await connect_handshake(
            reader, self.writer, self.identity, domain=coordinator_domain("bench"), timeout=30
        )
        self.task = asyncio.create_task(self.read_loop())
        await self.send(Join(run_id="bench", p2p_address=self.p2p_address))

    def is_settled_state(self, frame: bytes) -> bool:
        message = decode_payload(frame)
        if not isinstance(message, dict) or message.get("type") != "CoordinatorState":
            return False  # e.g. the `Reachability` notice after this client's probe
        coordinator = message["coordinator"]
        members = {entry[0] for entry in coordinator["epoch_state"]["clients"]}
        return (
            coordinator["run_state"] == RunState.Warmup
            and members == self.member_ids
            and set(message["peers"]) == self.member_ids
            and not message["unreachable"]
        )

    async def read_loop(self) -> None:
        try:
            while True:
                frame = await self.channel.read_payload(1 << 26)
                now = time.perf_counter()
                self.frames += 1
                if not self.settled:
                    if not self.is_settled_state(frame):
                        continue
                    self.settled = True
                self.bytes_last = len(frame) + 4 + TAG_SIZE
                if frame != self.last:
                    self.last = frame
                    self.changed_at.append(now)
        except Exception:
            return

    async def send(self, message: Any) -> None:
        await self.channel.send(to_wire(message))

    def close(self) -> None:
        if self.task is not None:
            self.writer.transport.abort()
            self.task.cancel()
        if self.stub is not None:
            self.stub.close()


async def start_server(state_path: Path) -> tuple[asyncio.subprocess.Process, int]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "psyche_server",
        "run",
        "--no-tui",
        "--state",
        str(state_path),
        "--log-level",
        "warning",
        "--host",
        "127.0.0.1",
        "--max-connections-per-ip",  # every bench client connects from loopback
        "100000",
        "--max-handshakes-per-ip",  # and they all handshake at once
        "100000",
        "--max-connections",
        "100000",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
    match = re.search(r"listening on [0-9.]+:(\d+)", line)
    if match is None:
        raise RuntimeError(f"server did not start: {line!r}")
    return process, int(match.group(1))


async def wait_until(predicate: Any, timeout: float, what: Any) -> None:
    """Poll `predicate` until true; after `timeout` seconds raise, saying `what()`."""
    deadline = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"benchmark condition not reached within {timeout:g}s: {what()}")
        await asyncio.sleep(0.01)


def settled_count(clients: list[BenchClient]) -> str:
    return f"{sum(c.settled for c in clients)} of {len(clients)} clients settled"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def connect_all(clients: list[BenchClient]) -> None:
    """Handshake and join, 100 clients at a time."""
    for start in range(0, len(clients), 100):
        await asyncio.gather(*(c.connect_and_join() for c in clients[start : start + 100]))


async def measure(
    n_clients: int, max_members: int, probes: int, idle_window: float, workdir: Path
) -> dict[str, Any]:
    members = min(n_clients, max_members)
    state_path = workdir / f"state-{n_clients}.toml"
    state_path.write_text(tomli_w.dumps(state_document(members)))
    process, port = await start_server(state_path)
    member_ids: set[bytes] = set()
    clients = [BenchClient(port, member_ids) for _ in range(n_clients)]
    member_ids.update(c.identity.public_key for c in clients[:members])
    try:
        # the members join and the run enters Warmup with them; then the pending ones join
        await connect_all(clients[:members])
        joined = clients[:members]
        await wait_until(
            lambda: all(c.settled for c in joined),
            60 + members / 10,
            lambda: f"the members in Warmup: {settled_count(joined)}",
        )
        await connect_all(clients[members:])
        # every client holds a state listing every member as a probed peer
        await wait_until(
            lambda: all(c.settled for c in clients),
            60 + n_clients / 10,
            lambda: f"every client settled: {settled_count(clients)}",
        )
        await asyncio.sleep(1.0)
        first = clients[0]

        # idle ticks: CPU per tick
        frames_before = first.frames
        cpu_before = process_cpu_seconds(process.pid)
        await asyncio.sleep(idle_window)
        cpu_after = process_cpu_seconds(process.pid)
        ticks = max(1, first.frames - frames_before)
        cpu_ms_per_tick = 1000 * (cpu_after - cpu_before) / ticks
        bytes_per_broadcast = first.bytes_last

        # latency probes: distinct members send a warmup witness each
        member_order = [
            entry[0]
            for entry in decode_payload(first.last)["coordinator"]["epoch_state"]["clients"]
        ]
        by_id = {c.identity.public_key: c for c in clients}
        latencies: list[dict[str, float]] = []
        for probe in range(probes):
            await asyncio.sleep(0.25)  # land between ticks
            counts = [len(c.changed_at) for c in clients]
            sender = by_id[member_order[probe]]
            witness = Witness(proof=WitnessProof(probe, probe, False))
            started = time.perf_counter()
            await sender.send(WarmupWitness(witness=witness.to_wire()))
            await wait_until(
                lambda counts=counts: all(
                    len(c.changed_at) > k for c, k in zip(clients, counts, strict=True)
                ),
                30,
                lambda probe=probe: f"latency probe {probe}: not every client got its state",
            )
            delays = [
                1000 * (c.changed_at[k] - started) for c, k in zip(clients, counts, strict=True)
            ]
            latencies.append(
                {
                    "p50": percentile(delays, 0.5),
                    "p99": percentile(delays, 0.99),
                    "max": max(delays),
                }
            )
        return {
            "clients": n_clients,
            "members": members,
            "bytes_per_broadcast": bytes_per_broadcast,
            "broadcast_latency_ms": {
                key: round(statistics.median(p[key] for p in latencies), 3)
                for key in ("p50", "p99", "max")
            },
            "server_cpu_ms_per_tick": round(cpu_ms_per_tick, 3),
            "ticks_measured": ticks,
        }
    finally:
        for client in clients:
            client.close()
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)


async def main_async(
    sizes: list[int], max_members: int, probes: int, idle_window: float, quick: bool
) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        baseline = await measure(BASELINE_CLIENTS, max_members, probes, idle_window, workdir)
        results = {
            str(n): await measure(n, max_members, probes, idle_window, workdir) for n in sizes
        }

    def ratio(value: float, base: float) -> float | None:
        return round(value / base, 2) if base > 0 else None

    ratios = {
        size: {
            "latency_max": ratio(
                r["broadcast_latency_ms"]["max"], baseline["broadcast_latency_ms"]["max"]
            ),
            "latency_p50": ratio(
                r["broadcast_latency_ms"]["p50"], baseline["broadcast_latency_ms"]["p50"]
            ),
            "cpu_per_tick": ratio(r["server_cpu_ms_per_tick"], baseline["server_cpu_ms_per_tick"]),
            "bytes_per_broadcast": ratio(r["bytes_per_broadcast"], baseline["bytes_per_broadcast"]),
        }
        for size, r in results.items()
    }
    return {
        "benchmark": "server",
        "quick": quick,
        "tick_interval_s": 0.5,
        "idle_window_s": idle_window,
        "baseline": baseline,
        "results": results,
        "ratios_vs_baseline": ratios,
        "cpu_us_per_added_connection": {
            size: round(
                1000
                * (r["server_cpu_ms_per_tick"] - baseline["server_cpu_ms_per_tick"])
                / max(1, r["clients"] - baseline["clients"]),
                2,
            )
            for size, r in results.items()
        },
        "goals": {size: goals(results[size], ratios[size]) for size in results},
        "cpu_count": os.cpu_count(),
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
    }


def goals(result: dict[str, Any], ratios: dict[str, float | None]) -> dict[str, bool | None]:
    """The server's goals at one size (they are set for 1,000 connections): broadcast latency
    p99 under 100 ms, CPU per tick at most 10x the baseline's."""
    cpu_ratio = ratios["cpu_per_tick"]
    return {
        "latency_p99_under_100_ms": result["broadcast_latency_ms"]["p99"] < LATENCY_P99_GOAL_MS,
        "cpu_per_tick_at_most_10x_baseline": (
            None if cpu_ratio is None else cpu_ratio <= CPU_RATIO_GOAL
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=None, help="client counts (default 256,1000)")
    parser.add_argument("--probes", type=int, default=None, help="latency probes (default 5)")
    parser.add_argument(
        "--members",
        type=int,
        default=None,
        help=f"most members of the epoch, the rest pending (default {MAX_MEMBERS})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="40 clients, 24 of them members, 2 probes, 2 s idle (seconds)",
    )
    args = parser.parse_args()
    sizes_text = args.sizes or ("40" if args.quick else "256,1000")
    sizes = [int(s) for s in sizes_text.split(",") if s]
    max_members = args.members or (QUICK_MEMBERS if args.quick else MAX_MEMBERS)
    if not BASELINE_CLIENTS <= max_members <= MAX_MEMBERS:
        parser.error(f"--members must be from {BASELINE_CLIENTS} to {MAX_MEMBERS}")
    probes = args.probes or (2 if args.quick else 5)
    idle_window = 2.0 if args.quick else 5.0
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        report = runner.run(main_async(sizes, max_members, probes, idle_window, args.quick))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
