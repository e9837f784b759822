"""Benchmark: late-joiner parameter download over P2P vs. a raw loopback socket copy.

`measure_parameter_fetch(total_mb)` starts `peers` serving nodes on 127.0.0.1 holding random
"parameters" that add up to `total_mb` MiB, times a joiner's full `download_model` (manifest
poll, handshakes, chunked transfer, hash checks), then times copying the same number of bytes
through one plain asyncio socket on loopback (the floor). `bench/client.py` reports the ratio.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from psyche_common.protocol import Identity

from .config import MIB, P2PConfig
from .manifest import ModelManifest, parameter_info
from .model_share import download_model
from .node import P2PNode


def _random_parameters(total_bytes: int, count: int) -> dict[str, bytes]:
    sizes = [total_bytes // count] * count
    sizes[-1] += total_bytes - sum(sizes)
    return {f"layer.{i:03d}.weight": os.urandom(size) for i, size in enumerate(sizes)}


async def _time_p2p(parameters: dict[str, bytes], peers: int, config: P2PConfig) -> float:
    manifest = ModelManifest.build(
        step=1,
        epoch=0,
        parameters=[parameter_info(n, "uint8", [len(b)], b) for n, b in parameters.items()],
    )
    identities = [Identity.generate() for _ in range(peers + 1)]
    members = {i.public_key for i in identities}
    nodes = [
        P2PNode(
            identity,
            is_member=members.__contains__,
            config=config,
            get_manifest=lambda: manifest,
            get_parameter_bytes=parameters.get,
        )
        for identity in identities
    ]
    try:
        for node in nodes:
            await node.start()
        book = {node.peer_id: node.address for node in nodes}
        for node in nodes:
            node.set_peers(book)
        joiner, servers = nodes[0], nodes[1:]
        started = time.perf_counter()
        result = await download_model(joiner, [s.peer_id for s in servers])
        elapsed = time.perf_counter() - started
        if result.parameters != parameters:
            raise RuntimeError("benchmark download returned different bytes")
        return elapsed
    finally:
        for node in nodes:
            await node.close()


async def _time_raw_copy(payload: bytes) -> float:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payload)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = await reader.readexactly(len(payload))
        elapsed = time.perf_counter() - started
        writer.close()
        if len(data) != len(payload):
            raise RuntimeError("raw copy returned a different size")
        return elapsed
    finally:
        server.close()
        await server.wait_closed()


async def measure_parameter_fetch(
    total_mb: float,
    *,
    peers: int = 3,
    parameter_count: int = 16,
    config: P2PConfig | None = None,
) -> dict[str, Any]:
    """Seconds to download `total_mb` MiB of parameters from `peers` nodes vs. a raw copy."""
    total_bytes = max(parameter_count, int(total_mb * MIB))
    parameters = _random_parameters(total_bytes, parameter_count)
    config = config or P2PConfig(bind_host="127.0.0.1")
    p2p_seconds = await _time_p2p(parameters, peers, config)
    raw_seconds = await _time_raw_copy(b"".join(parameters.values()))
    megabytes = total_bytes / MIB
    return {
        "megabytes": round(megabytes, 3),
        "peers": peers,
        "parameters": parameter_count,
        "p2p_seconds": round(p2p_seconds, 6),
        "raw_loopback_seconds": round(raw_seconds, 6),
        "p2p_mb_per_s": round(megabytes / p2p_seconds, 2),
        "raw_mb_per_s": round(megabytes / raw_seconds, 2),
        "ratio_p2p_over_raw": round(p2p_seconds / raw_seconds, 3),
    }
