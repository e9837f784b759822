"""Mid-epoch joiners proving they hold the members' weights (`[config] join_mid_epoch`).

A joiner (`epoch_state.joining`) that loaded the members' snapshot reports its weights hash at
the snapshot step (a `HealthCheck` with no accusations, like a member's status report). The
server keeps each joiner's latest claim for that step and compares it with the hash a
majority of the members reported for the step (`consistency.WeightsHashTracker.majority`,
one vote per voter, so keys that are not members cannot forge it): equal, and the joiner is
marked in sync (`Coordinator.joiner_in_sync`) and seated at the next round start. A claim
arriving before the members' majority waits for it (`check` runs at every tick); a claim
that differs from the majority is logged and dropped (the joiner may report again, or time
out and be admitted afresh with a new snapshot). Bookkeeping only, no I/O.
"""

from __future__ import annotations

import logging

from psyche_common.client_id import short_id
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.joining import joiner, snapshot_step

from .consistency import WeightsHashMonitor

log = logging.getLogger("psyche.server")


class JoinerProofs:
    def __init__(self, coordinator: Coordinator, weights: WeightsHashMonitor) -> None:
        self.coordinator = coordinator
        self.weights = weights
        self._claims: dict[bytes, tuple[int, bytes]] = {}
        """Joiner → (snapshot step, weights hash) it reported, until judged."""

    def offer(self, client_id: bytes, step: int, weights_hash: bytes) -> None:
        """A weights report from `client_id`: kept when it is a joiner's, at its snapshot
        step, and judged at once if the members' majority is in."""
        found = joiner(self.coordinator, client_id)
        if found is None or found.ready or step != snapshot_step(self.coordinator, found):
            return
        self._claims[client_id] = (step, weights_hash)
        self.check()

    def check(self) -> list[bytes]:
        """Judge the kept claims whose step has a members' majority; returns the joiners
        marked in sync."""
        coordinator = self.coordinator
        ready: list[bytes] = []
        for client_id, (step, weights_hash) in list(self._claims.items()):
            found = joiner(coordinator, client_id)
            if found is None or found.ready or step != snapshot_step(coordinator, found):
                del self._claims[client_id]  # seated, removed, or re-admitted since
                continue
            majority = self.weights.tracker.majority(step)
            if majority is None:
                continue
            del self._claims[client_id]
            if majority != weights_hash:
                log.warning(
                    "joiner %s reported weights at step %d that differ from the members' "
                    "majority: not seated",
                    short_id(client_id),
                    step,
                    extra={
                        "client": short_id(client_id),
                        "step": step,
                        "weights_hash": weights_hash.hex(),
                        "majority_hash": majority.hex(),
                    },
                )
                continue
            coordinator.joiner_in_sync(client_id)
            ready.append(client_id)
            log.info(
                "joiner %s holds the members' weights at step %d: seated at the next round",
                short_id(client_id),
                step,
                extra={"client": short_id(client_id), "step": step, "event": "joiner_in_sync"},
            )
        return ready
