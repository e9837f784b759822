"""Fuzz: thousands of random and mutated frames from many connections, then an honest round.

Fuzzers never use the run's real id, so they can never become members; everything else
(garbage before/after the handshake, truncated frames, random msgpack, valid messages with
mutated fields) is fair game. The server must keep serving and the honest clients must still
complete rounds and an epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
from pathlib import Path
from typing import Any

from psyche_common.coordinator import RunState
from psyche_common.protocol import Identity, connect_handshake, coordinator_domain, encode_payload
from psyche_server.connections import ConnectionLimits

from bench.harness.protocol_client import start_clients
from tests.support.server_harness import poll_until, running_server, write_state

FRAMES_PER_WORKER = 600
WORKERS = 12
KEY = bytes(32)

TEMPLATES: list[dict[str, Any]] = [
    {"type": "Join", "run_id": "not-the-run", "p2p_address": "127.0.0.1:9", "client_version": "x"},
    {"type": "HealthCheck", "checks": [], "step": 3, "weights_hash": KEY},
    {
        "type": "HealthCheck",
        "checks": [{"id": KEY, "proof": {"committee": 2, "position": 0, "index": 0}}],
    },
    {
        "type": "Witness",
        "witness": {
            "proof": {"position": 0, "index": 0, "witness": True},
            "participant_bloom": {"keys": [1] * 8, "bits": bytes(128)},
            "broadcast_bloom": {"keys": [2] * 8, "bits": bytes(128)},
            "broadcast_merkle": KEY,
        },
        "metadata": {"step": 1, "loss": 2.0, "weights_hash": KEY},
    },
    {"type": "WarmupWitness", "witness": {"proof": {"position": 1, "index": 1, "witness": False}}},
    {"type": "Checkpoint", "checkpoint": {"Hub": {"repo_id": "x/y", "revision": "abc"}}},
]

WEIRD_VALUES: list[Any] = [
    None,
    True,
    -1,
    2**64,
    2**63,
    1.5e308,
    float("nan"),
    "",
    "x" * 300,
    b"",
    b"\x00" * 33,
    [],
    {},
    [[[[]]]],
    {"a": {"b": {"c": 1}}},
    {b"k": 1},
    {1: 2},
]


def mutate(rng: random.Random, value: Any, depth: int = 0) -> Any:
    if depth > 4 or rng.random() < 0.25:
        return rng.choice(WEIRD_VALUES)
    if isinstance(value, dict):
        out = dict(value)
        if out and rng.random() < 0.7:
            key = rng.choice(list(out))
            if rng.random() < 0.15:
                del out[key]
            else:
                out[key] = mutate(rng, out[key], depth + 1)
        if rng.random() < 0.1:
            out[rng.choice(["extra", "type", "zz"])] = rng.choice(WEIRD_VALUES)
        return out
    if isinstance(value, list):
        out_list = list(value)
        if out_list and rng.random() < 0.7:
            i = rng.randrange(len(out_list))
            out_list[i] = mutate(rng, out_list[i], depth + 1)
        return out_list
    if isinstance(value, bytes):
        if not value:
            return rng.randbytes(rng.randrange(40))
        data = bytearray(value)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([-1, 1, 2**32, -(2**40)])
    return rng.choice(WEIRD_VALUES)


def random_frame(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.55:
        payload = encode_payload(mutate(rng, rng.choice(TEMPLATES)))
    elif kind < 0.7:
        payload = encode_payload(rng.choice(TEMPLATES))
        payload = bytes(b ^ (1 << rng.randrange(8)) if rng.random() < 0.05 else b for b in payload)
    elif kind < 0.85:
        payload = rng.randbytes(rng.randrange(1, 64))
    elif kind < 0.95:
        body = encode_payload(rng.choice(TEMPLATES))
        return (
            struct.pack(">I", len(body) + rng.randrange(1, 100)) + body[: rng.randrange(len(body))]
        )
    else:
        return struct.pack(">I", rng.choice([2**31, 2**20, 10**9]))
    return struct.pack(">I", len(payload)) + payload


async def fuzz_worker(port: int, run_id: str, seed: int, counter: list[int]) -> None:
    rng = random.Random(seed)
    sent = 0
    while sent < FRAMES_PER_WORKER:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, TimeoutError, Exception):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                if rng.random() < 0.1:
                    writer.write(random_frame(rng))  # garbage instead of a handshake
                    sent += 1
                    await writer.drain()
                    continue
                channel = await connect_handshake(
                    reader,
                    writer,
                    Identity.generate(),
                    domain=coordinator_domain(run_id),
                    timeout=5,
                )
                for _ in range(rng.randrange(1, 40)):
                    frame = random_frame(rng)
                    # mostly authenticated garbage (what a member could send: it reaches the
                    # decoder), sometimes raw bytes (what a man in the middle could: refused
                    # by the link's authentication)
                    sealed = rng.random() < 0.9 and len(frame) > 4
                    writer.write(channel.seal_payload(frame[4:]) if sealed else frame)
                    sent += 1
                    await writer.drain()
                    if writer.transport.is_closing() or reader.at_eof():
                        break
                    if rng.random() < 0.3:
                        await asyncio.sleep(0)
            finally:
                writer.transport.abort()
    counter[0] += sent


async def test_fuzzed_server_still_completes_rounds(tmp_path: Path) -> None:
    logging.getLogger("psyche.server").setLevel(logging.ERROR)
    try:
        state = write_state(
            tmp_path / "s.toml",
            init_min_clients=2,
            global_batch_size=2,
            epoch_time=4,
            warmup_time=1,
        )
        limits = ConnectionLimits(max_frame_size=64 * 1024, handshake_timeout=1.0)
        async with running_server(state, limits=limits) as app:
            counter = [0]
            await asyncio.gather(
                *(fuzz_worker(app.port, app.run_id, seed, counter) for seed in range(WORKERS))
            )
            assert counter[0] >= WORKERS * FRAMES_PER_WORKER
            assert app.pending == {}, "no fuzzer may have joined"
            # the fuzz reached the server: many connections ended by a protocol violation
            # or a failed handshake, and some mutated frames were valid messages (before a
            # Join only control frames are decoded, flat maps of scalars: the nested
            # templates, Witness and HealthCheck with checks, are refused before parsing)
            assert app.connections.protocol_violations + app.connections.rejected_connections > 500
            assert app.stats.messages > 30
            honest = await start_clients(2, app.port, app.run_id)
            await poll_until(lambda: app.run_state == RunState.RoundTrain, timeout=15)
            await poll_until(lambda: app.coordinator.progress.epoch == 1, timeout=40)
            assert len(app.connections.connections) == 2
            for client in honest:
                await client.close()
    finally:
        logging.getLogger("psyche.server").setLevel(logging.NOTSET)
