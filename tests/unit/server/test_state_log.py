"""The server logs every change of run state: those a tick makes and those a client message
makes (the last warmup witness moves Warmup to RoundTrain before any tick)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest
from psyche_common.coordinator import RunState, Witness
from psyche_common.coordinator.committee import WitnessProof
from psyche_common.protocol.messages import WarmupWitness
from psyche_server.app import ServerApp
from psyche_server.connections import Connection

from tests.support.coordinators import ids, make_coordinator


def state_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    records: list[Any] = [r for r in caplog.records if r.getMessage().startswith("run state ")]
    return [(r.old_state, r.new_state, r.cause) for r in records]


async def test_message_driven_state_changes_are_logged_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    app = ServerApp(make_coordinator(), clock=lambda: now[0])
    members = ids(2)
    for member in members:
        app.pending[member] = None
    caplog.set_level(logging.INFO, logger="psyche.server")
    try:
        app.coordinator.run_state_start_unix_timestamp = 0
        app.tick()
        assert app.run_state == RunState.Warmup
        app.tick()  # no change, no line
        clients = [client.id for client in app.coordinator.epoch_state.clients]
        sender = b""
        for index, sender in enumerate(clients):  # until the warmup witnesses suffice
            conn = cast(Connection, SimpleNamespace(peer_id=sender))
            witness = Witness(proof=WitnessProof(index, index, False))
            await app.on_client_message(conn, WarmupWitness(witness=witness.to_wire()))
            if app.run_state != RunState.Warmup:
                break
        assert app.run_state == RunState.RoundTrain
        last = sender.hex()[:8]
        assert state_lines(caplog) == [
            ("WaitingForMembers", "Warmup", "tick"),
            ("Warmup", "RoundTrain", f"WarmupWitness from {last}"),
        ]
        app.tick()  # the tick after the message does not log the change again
        assert len(state_lines(caplog)) == 2
    finally:
        app.scheduler.cancel()
