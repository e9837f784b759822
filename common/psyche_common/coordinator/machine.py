"""`Coordinator`: the coordinator's state with every input as a method (the top of the package).

Each method hands the state to the rule module that owns the input: `transitions` (tick,
pause, resume), `witnesses` (warmup and round witnesses, health checks), `accusations`
(verification reports), `equivocation`, `checkpoints`; `wire` gives the broadcast and
state.toml forms. The rules take the state (`state.CoordinatorState`), never this class, so
the package imports only downwards.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from psyche_common.announcements import SignatureCheck
from psyche_common.batch_id import BatchId
from psyche_common.config import AnyCheckpoint, StateFile
from psyche_common.coordinator import (
    accusations,
    checkpoints,
    equivocation,
    joining,
    transitions,
    wire,
    witnesses,
)
from psyche_common.coordinator.assignment import get_batch_size
from psyche_common.coordinator.committee import CommitteeProof
from psyche_common.coordinator.equivocation import EquivocationProof
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import TickResult, Witness
from psyche_common.coordinator.verdicts import Accusation, Attestation, Conviction


class Coordinator(CoordinatorState):
    """The whole coordinator state (`CoordinatorState`) and its inputs; see the module
    docstring. The clock (`now`) is unix seconds as a float, randomness (`seed`) a u64."""

    # ----- construction and serialization (see `wire`) -----

    @classmethod
    def from_state_file(cls, state_file: StateFile) -> Coordinator:
        return cls(**wire.fields_from_state_file(state_file))

    def to_state_file(self) -> StateFile:
        return wire.to_state_file(self)

    def to_wire(self) -> dict[str, Any]:
        return wire.to_wire(self)

    @classmethod
    def from_wire(cls, data: Any) -> Coordinator:
        return cls(**wire.fields_from_wire(data))

    def reset_ephemeral(self) -> None:
        """What the server does to a loaded state at startup (and to a copy before saving)."""
        wire.reset_ephemeral(self)

    # ----- inputs (see `transitions`, `witnesses`, `checkpoints`) -----

    def tick(
        self,
        pending: Sequence[bytes] | None,
        now: float,
        seed: int,
        holders: Collection[bytes] | None = None,
        sample_secret: bytes | None = None,
    ) -> TickResult:
        """Advance for the clock `now` (`transitions.tick`): `pending` the joined clients,
        `holders` those of them holding the run's weights (None: all); `sample_secret`: 32
        fresh random bytes, the hidden verifier-sample seed of a round this tick starts (the
        server always passes one; without it the seed is derived from `seed`, predictably)."""
        return transitions.tick(self, pending, now, seed, holders, sample_secret)

    def warmup_witness(
        self,
        from_id: bytes,
        witness: Witness,
        now: float,
        seed: int,
        sample_secret: bytes | None = None,
    ) -> None:
        witnesses.warmup_witness(self, from_id, witness, now, seed, sample_secret)

    def witness(self, from_id: bytes, witness: Witness, now: float) -> None:
        witnesses.witness(self, from_id, witness, now)

    def joiner_in_sync(self, client_id: bytes) -> bool:
        """A joiner's weights hash at its snapshot step matched the members' majority (the
        server checked it): it is seated at the next round start (`joining`). False when
        `client_id` is not joining."""
        return joining.mark_ready(self, client_id)

    def health_check(self, from_id: bytes, checks: Sequence[tuple[bytes, CommitteeProof]]) -> int:
        return witnesses.health_check(self, from_id, checks)

    def accuse(self, from_id: bytes, accusation: Accusation) -> None:
        accusations.accuse(self, from_id, accusation)

    def attest(self, from_id: bytes, attestation: Attestation) -> None:
        accusations.attest(self, from_id, attestation)

    def convict_proven(
        self, trainer: bytes, step: int, batch: BatchId, reporter: bytes
    ) -> Conviction:
        return accusations.convict_proven(self, trainer, step, batch, reporter)

    def equivocation(
        self, reporter: bytes, proof: EquivocationProof, verify: SignatureCheck
    ) -> Conviction | None:
        """A self-proving report that a trainer signed two commitments for one batch: once
        `verify` accepts both signatures, convict it on proof, so it is dropped, its results
        not yet final are skipped, and it is never admitted again
        (`equivocation.record_equivocation`)."""
        return equivocation.record_equivocation(self, reporter, proof, verify)

    def checkpoint(
        self,
        from_id: bytes,
        index: int,
        checkpoint: AnyCheckpoint,
        checkpointers: Collection[bytes],
    ) -> None:
        checkpoints.checkpoint_message(self, from_id, index, checkpoint, checkpointers)

    def batch_size_at(self, data_index: int) -> int:
        """The global batch size of a round whose data starts at sample `data_index`."""
        return get_batch_size(self.config, data_index * self.model.max_seq_len)

    def pause(self, now: float) -> None:
        transitions.pause(self, now)

    def resume(self, now: float) -> None:
        transitions.resume(self, now)
