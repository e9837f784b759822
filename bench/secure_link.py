"""What the encrypted links cost; prints exactly one JSON object on stdout.

Every link of the project (coordinator, data server, relay, P2P) seals each frame after its
handshake (`psyche_common.protocol.secure_channel`: AES-256-GCM, a counter nonce). This bench
measures that against the same link without it, on loopback. The headline figures have each
end in its own process, as on a real link: this script starts itself again with a hidden
`--serve` flag as the answering peer (the one that holds the model), and dials it:

- `model_share`: MB/s of a blob streamed the way a late joiner fetches the model's
  parameters (a `PeerLink` stream on each side, `transfer.send_bytes` / `receive_bytes`; the
  answer is a *bulk* stream, as `serving` makes every `GetParameter` / `GetManifest` answer:
  64 KiB chunks (`UploadShaper.bulk_chunk`), each passing the node's upload shaper, uncapped),
  per second of wall clock (`mb_per_s`) and per second of each process's CPU time
  (`sender_mb_per_cpu_s`: the serving process, which reports its own `time.process_time()`
  before and after each transfer; `receiver_mb_per_cpu_s`: this one; `both_mb_per_cpu_s`: the
  two together). On a loaded machine the wall clock mostly measures waiting for a CPU, the
  CPU time does not: there the throughput follows the CPU time of both ends together, on an
  idle one the slower end's;
- `blob_share`: the same for a regular (not bulk) answer in the P2P's default 256 KiB chunks,
  the way a `GetBlob` (a peer's result) is answered;
- `round_latency`: the request/answer round trip of one announcement-sized message (about
  1 KiB, like a result announcement and its `Ack`, which every round carries to every peer),
  p50 and p99 in microseconds;
- `in_process`: the same measurements with both ends in this process on one event-loop
  thread, which pays both ends' crypto in series (`mb_per_cpu_s` is both sides together);
- `state_seal`: the server's cost of sealing one coordinator state (`--state-kib`) for each of
  256 connections, in milliseconds.

Both sides of each pair run the real P2P handshake (`accept_peer` / `dial_over`), which ends
with the link encrypted; the baseline then drops the channel on both ends (the plain framing
of before, same code otherwise). This switch exists in the bench only: one serving process
runs for each mode. Figures are medians over `--repeats` alternating runs; `load_average` is
the machine's 1-minute load before and after (the machine is shared: state it next to the
figures). `slowdown_each` lists each repeat's slowdown from its own plain/encrypted pair (the
spread the load put on the medians).

`--quick` (what `make test` runs): an 8 MiB blob, 50 round trips, one repeat.

Usage: .venv/bin/python bench/secure_link.py [--blob-mib 64] [--round-trips 500] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from psyche_client.p2p.config import P2PConfig
from psyche_client.p2p.connection import PeerConnection, accept_peer, dial_over
from psyche_client.p2p.link import PeerLink, Stream
from psyche_client.p2p.pacing import UploadShaper
from psyche_client.p2p.stats import TransferStats
from psyche_client.p2p.transfer import receive_bytes, send_bytes
from psyche_common.protocol import Identity, encode_payload
from psyche_common.protocol.secure_channel import ChannelKeys, SecureChannel

CHUNK = P2PConfig().chunk_size
MAX_FRAME = P2PConfig().max_frame_size
TIMEOUT = 30.0


def shared_blob(size: int) -> bytes:
    """The blob both processes know without sending it: a fixed pseudo-random sequence."""
    return random.Random(size).randbytes(size)


class Responder:
    """The answering peer's requests, in the P2P's own link frames (a link closes on any
    other): `GetParameter` streams the blob as a bulk answer, as the model is served, and
    `GetBlob` as a regular one, as a peer's result is (the first `size` bytes of the blob,
    `size` named by the parameter name or the 8-byte big-endian hash); `Cpu` (a frame of no
    fields) is answered by an `Ack` whose `reason` is this process's CPU seconds so far;
    anything else by an `Ack`."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.shaper = UploadShaper()  # a node's, without an upload cap
        self._answers: set[asyncio.Future[None]] = set()

    def __call__(self, _link: PeerLink, stream: Stream, request: dict[str, Any]) -> None:
        kind = request.get("type")
        if kind in ("GetParameter", "GetBlob"):
            bulk = kind == "GetParameter"
            size = int(request["name"]) if bulk else int.from_bytes(request["hash"], "big")
            blob = self.blob if size >= len(self.blob) else self.blob[:size]
            chunk = CHUNK
            if bulk:
                stream.bulk = True
                chunk = self.shaper.bulk_chunk(CHUNK)
            answer = asyncio.ensure_future(send_bytes(stream, blob, chunk))
        elif kind == "Cpu":
            answer = asyncio.ensure_future(
                stream.send({"type": "Ack", "status": "ok", "reason": repr(time.process_time())})
            )
        else:
            answer = asyncio.ensure_future(stream.send({"type": "Ack", "status": "ok"}))
        self._answers.add(answer)
        answer.add_done_callback(self._answers.discard)


def blob_request(size: int, bulk: bool) -> dict[str, Any]:
    """The request for the blob's first `size` bytes (`Responder`)."""
    if bulk:
        return {"type": "GetParameter", "name": str(size)}
    return {"type": "GetBlob", "hash": size.to_bytes(8, "big")}


def make_link(
    conn: PeerConnection, encrypted: bool, dialed: bool, on_request: Responder
) -> PeerLink:
    assert conn.channel is not None, "the handshake must end encrypted"
    if not encrypted:
        conn.channel = None  # the baseline: the plain framing, same links otherwise
    return PeerLink(
        conn,
        dialed=dialed,
        on_request=on_request,
        idle_timeout=300.0,
        max_streams=64,
        shaper=on_request.shaper,
    )


async def listen(
    identity: Identity, encrypted: bool, responder: Responder, on_link: Callable[[PeerLink], None]
) -> asyncio.Server:
    """A loopback listener that runs the listener side of the handshake on each connection."""

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = PeerConnection(b"", reader, writer, TransferStats(), MAX_FRAME, TIMEOUT)
        await accept_peer(conn, identity, lambda _key: True, 10.0)
        link = make_link(conn, encrypted, False, responder)
        on_link(link)
        await link.start()

    return await asyncio.start_server(on_connect, "127.0.0.1", 0)


async def dial(port: int, peer_key: bytes, encrypted: bool) -> PeerLink:
    """The dialer side: a started link to the listener on `port`."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    conn = await dial_over(
        peer_key,
        reader,
        writer,
        Identity.generate(),
        TransferStats(),
        where="bench listener",
        handshake_timeout=10.0,
        max_frame_size=MAX_FRAME,
    )
    link = make_link(conn, encrypted, True, Responder(b""))
    link.start()
    return link


class LocalEnd:
    """The answering peer in this process (the in-process figures)."""

    def __init__(self, encrypted: bool, blob: bytes) -> None:
        self.encrypted = encrypted
        self.responder = Responder(blob)
        self.identity = Identity.generate()
        self.links: list[PeerLink] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await listen(
            self.identity, self.encrypted, self.responder, self.links.append
        )

    async def dial(self) -> PeerLink:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return await dial(port, self.identity.public_key, self.encrypted)

    async def stop(self) -> None:
        for link in self.links:
            await link.close()
        if self._server is not None:
            self._server.close()


class RemoteEnd:
    """The answering peer in its own process: this script run with `--serve`."""

    def __init__(self, encrypted: bool, blob_size: int) -> None:
        self.encrypted = encrypted
        self.blob_size = blob_size
        self._process: asyncio.subprocess.Process | None = None
        self._port = 0
        self._key = b""

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            os.path.abspath(__file__),
            "--serve",
            "encrypted" if self.encrypted else "plain",
            "--blob-bytes",
            str(self.blob_size),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), 60)
        if not line:
            raise RuntimeError(f"the serving process exited {await self._process.wait()}")
        ready = json.loads(line)
        self._port, self._key = ready["port"], bytes.fromhex(ready["key"])

    async def dial(self) -> PeerLink:
        return await dial(self._port, self._key, self.encrypted)

    async def stop(self) -> None:
        if self._process is None:
            return
        assert self._process.stdin is not None
        self._process.stdin.close()  # the serving process exits at the end of its stdin
        try:
            await asyncio.wait_for(self._process.wait(), 10)
        except TimeoutError:
            self._process.kill()
            await self._process.wait()


End = LocalEnd | RemoteEnd


async def serve(encrypted: bool, blob_size: int) -> None:
    """`--serve`: answer on a loopback port until stdin ends; first prints port and key."""
    identity = Identity.generate()
    links: list[PeerLink] = []
    server = await listen(identity, encrypted, Responder(shared_blob(blob_size)), links.append)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"port": port, "key": identity.public_key.hex()}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
    for link in links:
        await link.close()
    server.close()


async def remote_cpu_s(link: PeerLink) -> float:
    """The answering process's CPU seconds so far."""
    stream = link.open_stream()
    await stream.send({"type": "Cpu"})
    answer = await stream.receive(10.0)
    stream.close()
    return float(answer["reason"])


async def share_once(end: End, blob: bytes, bulk: bool) -> tuple[float, float, float]:
    """(wall-clock seconds, this process's CPU seconds, the answering process's CPU seconds)
    to stream `blob` over a fresh link to `end` (as a bulk answer: `bulk`); for a `LocalEnd`
    both CPU figures are this process's (both sides together)."""
    link = await end.dial()
    try:
        sender_cpu = await remote_cpu_s(link)
        started, cpu = time.perf_counter(), time.process_time()
        stream = link.open_stream()
        await stream.send(blob_request(len(blob), bulk))
        received = await receive_bytes(stream, max_size=len(blob), read_timeout=TIMEOUT)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        stream.close()
        sender_cpu = await remote_cpu_s(link) - sender_cpu
        assert received.data == blob, "the blob arrived altered"
        return elapsed, cpu, sender_cpu
    finally:
        await link.close()


async def round_trips_us(end: End, count: int) -> list[float]:
    link = await end.dial()
    announcement = {
        "type": "Announce",
        "announcement": {"signature": os.urandom(64), "body": os.urandom(836)},
    }
    times = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            stream = link.open_stream()
            await stream.send(announcement)
            await stream.receive(10.0)
            stream.close()
            times.append((time.perf_counter() - started) * 1e6)
    finally:
        await link.close()
    return times


def state_seal_ms(state_kib: int, connections: int) -> float:
    """Milliseconds to seal one state payload once per connection (what a broadcast adds)."""
    payload = encode_payload(
        {"type": "CoordinatorState", "coordinator": os.urandom(state_kib * 1024)}
    )
    channels = [
        SecureChannel(
            asyncio.StreamReader(),
            None,  # type: ignore[arg-type]  # sealing never touches the stream
            ChannelKeys(os.urandom(32), os.urandom(32)),
            peer="bench",
        )
        for _ in range(connections)
    ]
    started = time.perf_counter()
    for channel in channels:
        channel.seal_payload(payload)
    return (time.perf_counter() - started) * 1000


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


SHARES = {"model_share": True, "blob_share": False}
"""The transfers measured, and whether each is a bulk answer."""


class Rates:
    """One transfer kind's rates in one mode over the repeats."""

    def __init__(self) -> None:
        self.mb_per_s: list[float] = []
        self.receiver_mb_per_cpu_s: list[float] = []
        self.sender_mb_per_cpu_s: list[float] = []
        self.both_mb_per_cpu_s: list[float] = []

    async def take(self, end: End, blob: bytes, bulk: bool) -> None:
        wall, cpu, sender_cpu = await share_once(end, blob, bulk)
        megabytes = len(blob) / 1e6
        self.mb_per_s.append(megabytes / wall)
        self.receiver_mb_per_cpu_s.append(megabytes / max(cpu, 1e-6))
        self.sender_mb_per_cpu_s.append(megabytes / max(sender_cpu, 1e-6))
        self.both_mb_per_cpu_s.append(megabytes / max(cpu + sender_cpu, 1e-6))

    def summary(self, separate: bool) -> dict[str, float]:
        """Medians; `separate`: the ends ran in two processes, so each has its CPU figure
        (else this process's CPU time is both ends together)."""
        cpu = {"mb_per_cpu_s": self.receiver_mb_per_cpu_s}
        if separate:
            cpu = {
                "sender_mb_per_cpu_s": self.sender_mb_per_cpu_s,
                "receiver_mb_per_cpu_s": self.receiver_mb_per_cpu_s,
                "both_mb_per_cpu_s": self.both_mb_per_cpu_s,
            }
        figures = {"mb_per_s": round(statistics.median(self.mb_per_s), 1)}
        for key, rates in cpu.items():
            figures[key] = round(statistics.median(rates), 1)
        return figures


class Samples:
    """One mode's measurements over the repeats."""

    def __init__(self) -> None:
        self.shares = {name: Rates() for name in SHARES}
        self.round_trips_us: list[float] = []

    async def take(self, end: End, blob: bytes, round_trips: int) -> None:
        for name, bulk in SHARES.items():
            await self.shares[name].take(end, blob, bulk)
        self.round_trips_us.extend(await round_trips_us(end, round_trips))

    def summary(self, separate: bool) -> dict[str, Any]:
        figures: dict[str, Any] = {
            name: rates.summary(separate) for name, rates in self.shares.items()
        }
        figures["round_trip_p50_us"] = round(percentile(self.round_trips_us, 0.5), 1)
        figures["round_trip_p99_us"] = round(percentile(self.round_trips_us, 0.99), 1)
        return figures


def slower_percent(plain: float, secure: float) -> float:
    """How much more time per byte the encrypted mode takes, from two rates."""
    return round(100 * (plain / secure - 1), 1)


def slowdown_percent(plain: float, secure: float) -> float:
    """How much lower the encrypted mode's throughput is, from two rates."""
    return round(100 * (1 - secure / plain), 1)


def share_comparison(plain: Rates, secure: Rates, separate: bool) -> dict[str, Any]:
    medians_plain, medians_secure = plain.summary(separate), secure.summary(separate)
    share: dict[str, Any] = {
        "slowdown_percent": slowdown_percent(medians_plain["mb_per_s"], medians_secure["mb_per_s"]),
        "slowdown_each": [
            slowdown_percent(p, s) for p, s in zip(plain.mb_per_s, secure.mb_per_s, strict=True)
        ],
    }
    for key in (key for key in medians_plain if key.endswith("mb_per_cpu_s")):
        share[key.replace("mb_per_cpu_s", "cpu_cost_percent")] = slower_percent(
            medians_plain[key], medians_secure[key]
        )
    return share


def comparison(plain: Samples, secure: Samples, separate: bool) -> dict[str, Any]:
    latency_plain = percentile(plain.round_trips_us, 0.5)
    latency_secure = percentile(secure.round_trips_us, 0.5)
    return {
        **{
            name: share_comparison(plain.shares[name], secure.shares[name], separate)
            for name in SHARES
        },
        "round_latency": {
            "added_p50_us": round(latency_secure - latency_plain, 1),
            "ratio_p50": round(latency_secure / latency_plain, 3),
        },
    }


async def measure_ends(
    ends: dict[bool, End], blob: bytes, args: argparse.Namespace, separate: bool
) -> dict[str, Any]:
    """Alternate plain and encrypted over `--repeats` (drifting load hits both alike)."""
    samples = {False: Samples(), True: Samples()}
    for end in ends.values():
        await end.start()
    try:
        for end in ends.values():  # warm up both code paths in every process
            for bulk in SHARES.values():
                await share_once(end, blob, bulk)
        for _ in range(args.repeats):
            for encrypted in (False, True):
                await samples[encrypted].take(ends[encrypted], blob, args.round_trips)
    finally:
        for end in ends.values():
            await end.stop()
    return {
        "plain": samples[False].summary(separate),
        "encrypted": samples[True].summary(separate),
        **comparison(samples[False], samples[True], separate),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    blob = shared_blob(args.blob_mib * 1024 * 1024)
    load_before = os.getloadavg()[0]
    two_process = await measure_ends(
        {False: RemoteEnd(False, len(blob)), True: RemoteEnd(True, len(blob))},
        blob,
        args,
        separate=True,
    )
    in_process = await measure_ends(
        {False: LocalEnd(False, blob), True: LocalEnd(True, blob)},
        blob,
        args,
        separate=False,
    )
    seal_ms = statistics.median(state_seal_ms(args.state_kib, 256) for _ in range(3))
    return {
        "benchmark": "secure_link",
        "quick": args.quick,
        "setup": {
            "blob_mib": args.blob_mib,
            "chunk_kib": {
                "model_share": UploadShaper().bulk_chunk(CHUNK) // 1024,
                "blob_share": CHUNK // 1024,
            },
            "round_trips": args.round_trips,
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
            "cipher": "AES-256-GCM",
        },
        "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        **two_process,
        "in_process": in_process,
        "state_seal": {
            "state_kib": args.state_kib,
            "connections": 256,
            "ms": round(seal_ms, 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--blob-mib", type=int, default=64)
    parser.add_argument("--round-trips", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--state-kib", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="the smallest sizes (make test)")
    # the answering peer of the two-process figures (this script starts it itself)
    parser.add_argument("--serve", choices=("plain", "encrypted"), help=argparse.SUPPRESS)
    parser.add_argument("--blob-bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        asyncio.run(serve(args.serve == "encrypted", args.blob_bytes))
        return
    if args.quick:
        args.blob_mib, args.round_trips, args.repeats = 8, 50, 1
    print(json.dumps(asyncio.run(measure(args)), indent=2))


if __name__ == "__main__":
    main()
