"""Helpers for server integration tests: short-timing state files and an in-process server."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import string
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import tomli_w
from psyche_common.config import load_state
from psyche_common.coordinator import Coordinator
from psyche_server.app import ServerApp, ServerOptions
from psyche_server.connections import ConnectionLimits


def random_run_id() -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(16))


def write_state(
    path: Path,
    *,
    run_id: str | None = None,
    init_min_clients: int = 2,
    min_clients: int | None = None,
    global_batch_size: int = 4,
    witness_nodes: int = 1,
    warmup_time: int = 2,
    cooldown_time: int = 1,
    max_round_train_time: int = 3,
    round_witness_time: float = 1,
    epoch_time: int = 30,
    total_steps: int = 100,
    waiting_for_members_extra_time: int = 1,
    data_location: Any = "Dummy",
    max_seq_len: int = 16,
) -> Path:
    """A state.toml like the reference harness's (Dummy model and data) with short phases."""
    document = {
        "run_id": run_id or random_run_id(),
        "run_state": "WaitingForMembers",
        "config": {
            "warmup_time": warmup_time,
            "cooldown_time": cooldown_time,
            "max_round_train_time": max_round_train_time,
            "round_witness_time": round_witness_time,
            "epoch_time": epoch_time,
            "waiting_for_members_extra_time": waiting_for_members_extra_time,
            "total_steps": total_steps,
            "init_min_clients": init_min_clients,
            "min_clients": init_min_clients if min_clients is None else min_clients,
            "witness_nodes": witness_nodes,
            "verification_percent": 0,
            "global_batch_size_start": global_batch_size,
            "global_batch_size_end": global_batch_size,
            "global_batch_size_warmup_tokens": 0,
        },
        "model": {
            "LLM": {
                "architecture": "HfLlama",
                "data_type": "Pretraining",
                "max_seq_len": max_seq_len,
                "cold_start_warmup_steps": 0,
                "data_location": data_location,
                "checkpoint": {"Dummy": {"repo_id": "dummy"}},
                "lr_schedule": {
                    "Constant": {"base_lr": 1e-4, "warmup_steps": 0, "warmup_init_lr": 0.0}
                },
                "optimizer": "Dummy",
            }
        },
    }
    path.write_text(tomli_w.dumps(document))
    return path


def load_coordinator(path: Path) -> Coordinator:
    return Coordinator.from_state_file(load_state(path))


@contextlib.asynccontextmanager
async def running_server(
    state_path: Path,
    *,
    data_server: Any = None,
    tick_interval: float = 0.1,
    clock: Callable[[], float] | None = None,
    **options: Any,
) -> AsyncIterator[ServerApp]:
    """An in-process server on a random loopback port, stopped on exit."""
    limits = options.pop("limits", ConnectionLimits(handshake_timeout=2.0))
    server_options = ServerOptions(
        host="127.0.0.1", tick_interval=tick_interval, limits=limits, **options
    )
    kwargs: dict[str, Any] = {"data_server": data_server}
    if clock is not None:
        kwargs["clock"] = clock
    app = ServerApp(load_coordinator(state_path), server_options, **kwargs)
    await app.start()
    stop = asyncio.Event()
    task = asyncio.create_task(app.serve(stop))
    try:
        yield app
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def poll_until(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02
) -> Any:
    """Poll `predicate()` until truthy; returns its value or fails with the last value seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    value = predicate()
    while not value:
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)
        value = predicate()
    return value
