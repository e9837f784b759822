"""Forged weights-hash majorities (real processes; issue 18, finding 1).

Keys are free: five fresh identities that never join open the coordinator port, complete the
handshake, report one made-up weights hash for each of the next 64 steps in `HealthCheck`s
and close, again and again while the run trains. The server counts only the epoch's members,
so the three honest clients are never told their weights differ, never go out of sync, keep
training and end with identical weights at every step.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest
from psyche_common.protocol.messages import HealthCheck

from tests.e2e.client_run import Cluster, finish_in_agreement, write_state
from tests.support.protocol_client import ProtocolClient

pytestmark = pytest.mark.timeout(300)

FORGERS = 5
FORGED = b"\xf0" * 32


class HashForgers:
    """`FORGERS` throwaway keys, each connecting, reporting `FORGED` for steps 0-63 and closing,
    in a loop on a thread of its own until `stop()`; counts the reports it delivered."""

    def __init__(self, port: int, run_id: str) -> None:
        self.port = port
        self.run_id = run_id
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> HashForgers:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _run(self) -> None:
        while not self._stop.is_set():
            await asyncio.gather(*(self._one() for _ in range(FORGERS)))
            await asyncio.sleep(1.0)

    async def _one(self) -> None:
        forger = ProtocolClient(self.port, self.run_id, auto=False)
        with contextlib.suppress(OSError, ConnectionError, TimeoutError):
            await forger.connect(join=False)
            for step in range(64):
                await forger.send(HealthCheck(step=step, weights_hash=FORGED))
                self.sent += 1
        await forger.close()


def test_keys_that_never_joined_cannot_outvote_the_members(tmp_path: Path) -> None:
    c = Cluster(tmp_path, write_state(tmp_path / "state.toml", total_steps=12))
    forgers: HashForgers | None = None
    try:
        c.start_server()
        honest = [c.start_client(dummy_delay=0.3) for _ in range(3)]
        forgers = HashForgers(c.port, "e2e-run").start()
        common = finish_in_agreement(c, honest, min_common=8)
        assert forgers.sent >= FORGERS * 64, forgers.sent  # the forged reports went out
        server = c.server
        assert server is not None
        assert not server.events_with("majority_hash"), "the server flagged an honest client"
        for proc in honest:
            assert not [
                line for line in proc.lines() if "out of sync" in str(line.get("msg", ""))
            ], proc.tail()
            trained = proc.events("trained step")
            assert len(trained) >= len(common) - 2, (proc.name, len(trained), common)
    finally:
        if forgers is not None:
            forgers.stop()
        c.stop()
