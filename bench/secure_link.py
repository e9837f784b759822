"""What the encrypted links cost; prints exactly one JSON object on stdout.

Every link of the project (coordinator, data server, relay, P2P) seals each frame after its
handshake (`psyche_common.protocol.secure_channel`: AES-256-GCM, a counter nonce). This bench
measures that against the same link without it, on loopback, both ends in this process:

- `model_share`: MB/s of a blob streamed the way a late joiner fetches the model's
  parameters (a `PeerLink` stream on each side, `transfer.send_bytes` / `receive_bytes` in
  the P2P's default 256 KiB chunks), per second of wall clock (`mb_per_s`) and per second of
  this process's CPU time (`mb_per_cpu_s`: both ends run here, so this is what the sending
  and the receiving side cost together; on a loaded machine the wall clock mostly measures
  waiting for a CPU, the CPU time does not);
- `round_latency`: the request/answer round trip of one announcement-sized message (about
  1 KiB, like a result announcement and its `Ack`, which every round carries to every peer),
  p50 and p99 in microseconds;
- `state_seal`: the server's cost of sealing one coordinator state (`--state-kib`) for each of
  256 connections, in milliseconds, against the size of a round (`round_ms`).

Both sides of each pair run the real P2P handshake (`accept_peer` / `dial_over`), which ends
with the link encrypted; the baseline then drops the channel on both ends (the plain framing
of before, same code otherwise). This switch exists in the bench only. Figures are medians
over `--repeats` alternating runs; `load_average` is the machine's 1-minute load before and
after (the machine is shared: state it next to the figures).

`--quick` (what `make test` runs): an 8 MiB blob, 50 round trips, one repeat.

Usage: .venv/bin/python bench/secure_link.py [--blob-mib 64] [--round-trips 500] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from psyche_client.p2p.connection import PeerConnection, accept_peer, dial_over
from psyche_client.p2p.link import PeerLink, Stream
from psyche_client.p2p.stats import TransferStats
from psyche_client.p2p.transfer import receive_bytes, send_bytes
from psyche_common.protocol import Identity, encode_payload
from psyche_common.protocol.secure_channel import ChannelKeys, SecureChannel

CHUNK = 256 * 1024
MAX_FRAME = 1024 * 1024 + 4096


class LinkPair:
    """Two `PeerLink`s joined over loopback by the real P2P handshake."""

    def __init__(self, encrypted: bool) -> None:
        self.encrypted = encrypted
        self.blob = b""
        self.links: list[PeerLink] = []
        self._answers: set[asyncio.Future[None]] = set()
        self._server: asyncio.Server | None = None

    async def open(self) -> tuple[PeerLink, PeerLink]:
        listener_id, dialer_id = Identity.generate(), Identity.generate()
        accepted: asyncio.Future[PeerLink] = asyncio.get_running_loop().create_future()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = PeerConnection(b"", reader, writer, TransferStats(), MAX_FRAME, 30.0)
            await accept_peer(conn, listener_id, lambda _key: True, 10.0)
            link = self._link(conn, dialed=False)
            accepted.set_result(link)
            await link.start()

        self._server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = await dial_over(
            listener_id.public_key,
            reader,
            writer,
            dialer_id,
            TransferStats(),
            where="bench listener",
            handshake_timeout=10.0,
            max_frame_size=MAX_FRAME,
        )
        dialer = self._link(conn, dialed=True)
        dialer.start()
        listener = await asyncio.wait_for(accepted, 10)
        return dialer, listener

    def _link(self, conn: PeerConnection, *, dialed: bool) -> PeerLink:
        assert conn.channel is not None, "the handshake must end encrypted"
        if not self.encrypted:
            conn.channel = None  # the baseline: the plain framing, same links otherwise
        link = PeerLink(
            conn, dialed=dialed, on_request=self._answer, idle_timeout=300.0, max_streams=64
        )
        self.links.append(link)
        return link

    def _answer(self, _link: PeerLink, stream: Stream, request: dict[str, Any]) -> None:
        if request.get("type") == "Get":
            answer = asyncio.ensure_future(send_bytes(stream, self.blob, CHUNK))
        else:
            answer = asyncio.ensure_future(stream.send({"type": "Ack", "status": "ok"}))
        self._answers.add(answer)
        answer.add_done_callback(self._answers.discard)

    async def close(self) -> None:
        for link in self.links:
            await link.close()
        if self._server is not None:
            self._server.close()


async def share_seconds(encrypted: bool, blob: bytes) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds of this process) to stream `blob` over a link."""
    pair = LinkPair(encrypted)
    pair.blob = blob
    dialer, _listener = await pair.open()
    try:
        started, cpu = time.perf_counter(), time.process_time()
        stream = dialer.open_stream()
        await stream.send({"type": "Get"})
        received = await receive_bytes(stream, max_size=len(blob), read_timeout=30.0)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        stream.close()
        assert received.data == blob
        return elapsed, cpu
    finally:
        await pair.close()


async def round_trips_us(encrypted: bool, count: int) -> list[float]:
    pair = LinkPair(encrypted)
    dialer, _listener = await pair.open()
    announcement = {"type": "Announce", "announcement": os.urandom(900)}
    times = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            stream = dialer.open_stream()
            await stream.send(announcement)
            await stream.receive(10.0)
            stream.close()
            times.append((time.perf_counter() - started) * 1e6)
    finally:
        await pair.close()
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


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    blob = os.urandom(args.blob_mib * 1024 * 1024)
    load_before = os.getloadavg()[0]
    share: dict[bool, list[float]] = {False: [], True: []}
    share_cpu: dict[bool, list[float]] = {False: [], True: []}
    latency: dict[bool, list[float]] = {False: [], True: []}
    await share_seconds(True, blob[: 1024 * 1024])  # warm up both code paths
    await share_seconds(False, blob[: 1024 * 1024])
    for _ in range(args.repeats):
        for encrypted in (False, True):  # alternating: drifting load hits both alike
            wall, cpu = await share_seconds(encrypted, blob)
            share[encrypted].append(len(blob) / 1e6 / wall)
            share_cpu[encrypted].append(len(blob) / 1e6 / max(cpu, 1e-6))
            latency[encrypted].extend(await round_trips_us(encrypted, args.round_trips))

    def side(encrypted: bool) -> dict[str, float]:
        return {
            "mb_per_s": round(statistics.median(share[encrypted]), 1),
            "mb_per_cpu_s": round(statistics.median(share_cpu[encrypted]), 1),
            "round_trip_p50_us": round(percentile(latency[encrypted], 0.5), 1),
            "round_trip_p99_us": round(percentile(latency[encrypted], 0.99), 1),
        }

    plain, secure = side(False), side(True)
    seal_ms = statistics.median(state_seal_ms(args.state_kib, 256) for _ in range(3))
    return {
        "benchmark": "secure_link",
        "quick": args.quick,
        "setup": {
            "blob_mib": args.blob_mib,
            "chunk_kib": CHUNK // 1024,
            "round_trips": args.round_trips,
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
            "cipher": "AES-256-GCM",
        },
        "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "plain": plain,
        "encrypted": secure,
        "model_share": {
            "slowdown_percent": round(100 * (1 - secure["mb_per_s"] / plain["mb_per_s"]), 1),
            "cpu_cost_percent": round(
                100 * (plain["mb_per_cpu_s"] / secure["mb_per_cpu_s"] - 1), 1
            ),
        },
        "round_latency": {
            "added_p50_us": round(secure["round_trip_p50_us"] - plain["round_trip_p50_us"], 1),
            "ratio_p50": round(secure["round_trip_p50_us"] / plain["round_trip_p50_us"], 3),
        },
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
    args = parser.parse_args()
    if args.quick:
        args.blob_mib, args.round_trips, args.repeats = 8, 50, 1
    print(json.dumps(asyncio.run(measure(args)), indent=2))


if __name__ == "__main__":
    main()
