"""What an attack client reads of the public state, for the attackers that adapt to it.

`TappingUplink` is the client's uplink (`Parts(uplink=...)`) with one addition: it taps the
coordinator states its own server link receives (the broadcast every member gets) into a
`PublicView`, which keeps for each step the round's roles as every client derives them
(`derive_round_roles`: the round's public seed, its batches and their trainers, its
verifiers; predicted from RoundWitness on, as a client that trains the next round early does,
then taken from the round's own RoundTrain state) and, once the server reveals it at RoundWitness, the round's sample seed. Nothing
here is private to the server: it is what an attacker who reads every public value knows, and
when it knows it. The tap reads from the training thread too (`PublicView` is locked).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable

from psyche_client.round.next_round import predict_next_round
from psyche_client.round.roles import RoundRoles, derive_round_roles
from psyche_client.session.server_link import ServerLink, ServerUpdate
from psyche_client.session.uplink import SwitchableUplink
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.types import RunState
from psyche_common.coordinator.verification import revealed_sample_seed, verifier_sample

KEPT_STEPS = 8
"""Steps of roles and seeds a view keeps."""


class PublicView:
    """Each recent step's round roles and, once revealed, its sample seed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roles: dict[int, RoundRoles] = {}
        self._seeds: dict[int, bytes] = {}
        self._confirmed: set[int] = set()
        self.latest: Coordinator | None = None

    def observe(self, coordinator: Coordinator) -> None:
        step = coordinator.progress.step
        with self._lock:
            self.latest = coordinator
            if coordinator.run_state == RunState.RoundTrain and step not in self._confirmed:
                self._roles[step] = derive_round_roles(coordinator, b"", True)
                self._confirmed.add(step)
            elif coordinator.run_state == RunState.RoundWitness and step + 1 not in self._roles:
                predicted = predict_next_round(coordinator)
                if predicted is not None:
                    training = predicted.epoch_state.last_step == 0
                    self._roles[step + 1] = derive_round_roles(predicted, b"", training)
            for seen in (step, step - 1):
                seed = revealed_sample_seed(coordinator, seen)
                if seed is not None:
                    self._seeds[seen] = seed
            for table in (self._roles, self._seeds):
                for old in [s for s in table if s < step - KEPT_STEPS]:
                    del table[old]
            self._confirmed = {s for s in self._confirmed if s >= step - KEPT_STEPS}

    def roles(self, step: int) -> RoundRoles | None:
        with self._lock:
            return self._roles.get(step)

    def sample_seed(self, step: int) -> bytes | None:
        with self._lock:
            return self._seeds.get(step)

    def checkers(self, step: int, batch: BatchId, seed: bytes | None = None) -> list[bytes] | None:
        """The verifiers of `step` whose sample holds `batch`, by the round's revealed sample
        seed or by `seed`; None when the round or the seed is unknown."""
        roles = self.roles(step)
        seed = seed if seed is not None else self.sample_seed(step)
        if roles is None or seed is None:
            return None
        return [
            v
            for v in roles.verifiers
            if batch in verifier_sample(seed, v, roles.batch_ids, roles.verifiers)
        ]


class TappingUplink(SwitchableUplink):
    """The uplink, feeding every state of the link it is attached to into `view` (and to
    `on_update`, if given) before the client sees it."""

    def __init__(
        self, view: PublicView, on_update: Callable[[Coordinator], None] | None = None
    ) -> None:
        super().__init__()
        self.view = view
        self.on_update = on_update

    def attach(self, link: ServerLink) -> None:
        states = link.states

        async def tapped() -> AsyncIterator[ServerUpdate]:
            async for update in states():
                coordinator = Coordinator.from_wire(update.coordinator)
                self.view.observe(coordinator)
                if self.on_update is not None:
                    self.on_update(coordinator)
                yield update

        link.states = tapped  # type: ignore[method-assign]
        super().attach(link)
