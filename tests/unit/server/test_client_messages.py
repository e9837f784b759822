"""The server applies a `Checkpoint` only from the keys named with `--checkpointer`."""

from __future__ import annotations

import pytest
from psyche_common.config import HubCheckpoint
from psyche_common.coordinator import CoordinatorError, ErrorKind
from psyche_common.protocol.messages import Checkpoint
from psyche_server.client_messages import apply_client_message

from tests.support.coordinators import ids, make_coordinator, start_epoch

A, B = ids(2)


def test_checkpoint_from_a_member_that_is_not_a_checkpointer_is_refused() -> None:
    coord = make_coordinator(model={"checkpoint": {"Hub": {"repo_id": "org/run"}}})
    now = start_epoch(coord, [A, B])
    message = Checkpoint(checkpoint={"Hub": {"repo_id": "evil/run", "revision": None}})
    for checkpointers in (frozenset(), frozenset({B})):
        with pytest.raises(CoordinatorError) as excinfo:
            apply_client_message(coord, A, message, now, checkpointers)
        assert excinfo.value.kind == ErrorKind.NotCheckpointer
    assert coord.model.checkpoint == HubCheckpoint(repo_id="org/run")
    apply_client_message(coord, A, message, now, frozenset({A}))
    assert coord.model.checkpoint == HubCheckpoint(repo_id="evil/run")
