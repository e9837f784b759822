"""Equivocation: a trainer that signed two different commitments for one batch of one step.

An `EquivocationProof` is two `ResultCommitment`s (`protocol.result_commitment`) of the same
trainer for the same (step, batch) with different statements, both signatures valid. Any
client that receives both sends them to the server; the proof needs no witness and no
quorum: an honest trainer signs one result per batch, so the proof is its own evidence.

`record_equivocation` (the coordinator's `equivocation(proof)`) checks the proof, drops the
trainer (it leaves the epoch at the next round start, like a conviction), and keeps an
`Equivocation` record: every client skips the trainer's results from the first step whose
results are not yet final (`first_open_step`) on, in that epoch, and no later epoch admits
the key. A step's results are final once the next round's witnesses are in (RoundWitness):
from then on clients may apply them, so a proof cannot change what they apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psyche_common.client_id import short_id
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.types import ClientState, RunState, check_client_id
from psyche_common.protocol.result_commitment import ResultCommitment
from psyche_common.wire_checks import wire_map, wire_uint

if TYPE_CHECKING:
    from psyche_common.coordinator.state import Coordinator

MAX_EQUIVOCATIONS = 256
"""Equivocation records kept (the oldest are forgotten first)."""


@dataclass(frozen=True)
class EquivocationProof:
    """Two conflicting signed commitments of one trainer (see the module docstring)."""

    first: ResultCommitment
    second: ResultCommitment

    @property
    def trainer(self) -> bytes:
        return self.first.trainer

    def check(self) -> None:
        """Raise ValueError naming what makes this no proof."""
        a, b = self.first, self.second
        if a.trainer != b.trainer:
            raise ValueError("the two commitments are signed by different trainers")
        if (a.step, a.batch) != (b.step, b.batch):
            raise ValueError(
                f"the commitments name different batches ({a.batch} of step {a.step}, "
                f"{b.batch} of step {b.step})"
            )
        if a.statement() == b.statement():
            raise ValueError("the two commitments are the same")
        for name, commitment in (("first", a), ("second", b)):
            if not commitment.verifies():
                raise ValueError(
                    f"{name}.signature does not verify for trainer {short_id(a.trainer)}"
                )

    def to_wire(self) -> dict[str, Any]:
        return {"first": self.first.to_wire(), "second": self.second.to_wire()}

    @classmethod
    def from_wire(cls, data: Any) -> EquivocationProof:
        data = wire_map(data, "proof")
        return cls(
            ResultCommitment.from_wire(data.get("first"), "proof.first"),
            ResultCommitment.from_wire(data.get("second"), "proof.second"),
        )


@dataclass(frozen=True)
class Equivocation:
    """A proven equivocation: `trainer`'s results of `epoch` from `step` on are skipped."""

    epoch: int
    step: int
    trainer: bytes
    proven_step: int
    """The step the two commitments name."""

    def __str__(self) -> str:
        return (
            f"{short_id(self.trainer)} signed two commitments for one batch of step "
            f"{self.proven_step}; its results of epoch {self.epoch} from step {self.step} on "
            "are skipped"
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "trainer": self.trainer,
            "proven_step": self.proven_step,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Equivocation:
        data = wire_map(data, "equivocation")
        return cls(
            epoch=wire_uint(data, "epoch", "equivocation"),
            step=wire_uint(data, "step", "equivocation"),
            trainer=check_client_id(data.get("trainer"), "equivocation.trainer"),
            proven_step=wire_uint(data, "proven_step", "equivocation"),
        )


def first_open_step(coord: Coordinator) -> int:
    """The first step whose results no client may have applied yet: in RoundTrain of step C,
    C − 1 (its witnesses are still reporting); otherwise C."""
    step = coord.progress.step
    if coord.run_state == RunState.RoundTrain and step > 0:
        return step - 1
    return step


def record_equivocation(coord: Coordinator, proof: EquivocationProof) -> Equivocation | None:
    """Check `proof`, drop its trainer and record it; None when it is already recorded for
    this epoch. Raises `CoordinatorError(InvalidEquivocation)` when the proof is not one."""
    try:
        proof.check()
    except ValueError as exc:
        raise CoordinatorError(ErrorKind.InvalidEquivocation, str(exc)) from exc
    record = coord.verification
    epoch = coord.progress.epoch
    if any(e.trainer == proof.trainer and e.epoch == epoch for e in record.equivocations):
        return None
    equivocation = Equivocation(
        epoch=epoch,
        step=first_open_step(coord),
        trainer=proof.trainer,
        proven_step=proof.first.step,
    )
    record.equivocations.append(equivocation)
    del record.equivocations[:-MAX_EQUIVOCATIONS]
    for client in coord.epoch_state.clients:
        if client.id == proof.trainer and client.state == ClientState.Healthy:
            client.state = ClientState.Dropped
    return equivocation
