"""Joining again after a health check dropped us.

The coordinator moves a dropped client to `exited_clients` with state Dropped (or Ejected);
the server then forgets it as a pending joiner. Seeing its own dropped record, the client
sends `Join` again, once per record, so that it is in the next epoch instead of idling for
good.
"""

from __future__ import annotations

import logging

from psyche_common.coordinator import ClientState, Coordinator

from psyche_client.round.context import RoundContext
from psyche_client.round.ports import Uplink

DROPPED_STATES = frozenset({ClientState.Dropped, ClientState.Ejected})

log = logging.getLogger("psyche.client")


class Rejoin:
    def __init__(self, ctx: RoundContext, uplink: Uplink) -> None:
        self.ctx = ctx
        self.uplink = uplink
        self._rejoined_for: tuple[int, int] | None = None

    async def check(self, coordinator: Coordinator) -> None:
        record = next(
            (
                c
                for c in coordinator.epoch_state.exited_clients
                if c.id == self.ctx.me and c.state in DROPPED_STATES
            ),
            None,
        )
        if record is None:
            return
        key = (int(coordinator.epoch_state.start_timestamp), int(record.exited_height))
        if key == self._rejoined_for:
            return
        self._rejoined_for = key
        log.warning(
            "dropped from the epoch by a health check: joining again for the next epoch",
            extra=self.ctx.fields(),
        )
        await self.uplink.send_join()
