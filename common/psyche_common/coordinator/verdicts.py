"""Value types of verification: pending accusations and the kept record of convictions.

`Accusation`: a round's verifier says the result of `trainer` for `batch` at `step` does not
match its recomputation (`agreement_milli`: the measured sign agreement in thousandths).
`Conviction`: a trainer a verifier quorum accused; it was removed from the epoch, every
client skips its results from `step` on in that epoch, and later epochs do not admit it. `VerificationRecord` holds both; the
coordinator broadcasts it and the server saves it (`to_toml` / `from_toml`, where ids are hex).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id
from psyche_common.coordinator.equivocation import MAX_EQUIVOCATIONS, Equivocation
from psyche_common.coordinator.types import check_client_id
from psyche_common.wire_checks import wire_list, wire_map, wire_uint

MAX_CONVICTIONS = 256
"""Convictions kept in the record (the oldest are forgotten first)."""

MAX_ACCUSATIONS = 1024
"""Pending accusations held at once (two rounds' worth is far below this)."""


def _agreement(data: dict[str, Any], what: str) -> int:
    value = wire_uint(data, "agreement_milli", what)
    if value > 1000:
        raise ValueError(f"{what}.agreement_milli must be at most 1000, got {value}")
    return value


@dataclass(frozen=True)
class Accusation:
    step: int
    verifier: bytes
    trainer: bytes
    batch: BatchId
    agreement_milli: int

    def __str__(self) -> str:
        return (
            f"{short_id(self.verifier)} accuses {short_id(self.trainer)} of {self.batch} at step "
            f"{self.step} (agreement {self.agreement_milli / 1000:.3f})"
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "verifier": self.verifier,
            "trainer": self.trainer,
            "batch": self.batch.to_wire(),
            "agreement_milli": self.agreement_milli,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Accusation:
        data = wire_map(data, "accusation")
        return cls(
            step=wire_uint(data, "step", "accusation"),
            verifier=check_client_id(data.get("verifier"), "accusation.verifier"),
            trainer=check_client_id(data.get("trainer"), "accusation.trainer"),
            batch=BatchId.from_wire(data.get("batch")),
            agreement_milli=_agreement(data, "accusation"),
        )


@dataclass(frozen=True)
class Conviction:
    epoch: int
    step: int
    trainer: bytes
    batch: BatchId
    verifiers: tuple[bytes, ...]
    agreement_milli: int
    """The lowest agreement its accusers measured."""

    def __str__(self) -> str:
        accusers = ", ".join(short_id(v) for v in self.verifiers)
        return (
            f"{short_id(self.trainer)} convicted at step {self.step} (epoch {self.epoch}) for "
            f"{self.batch} by {accusers} (agreement {self.agreement_milli / 1000:.3f})"
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "trainer": self.trainer,
            "batch": self.batch.to_wire(),
            "verifiers": list(self.verifiers),
            "agreement_milli": self.agreement_milli,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Conviction:
        data = wire_map(data, "conviction")
        verifiers = wire_list(data, "verifiers", "conviction")
        return cls(
            epoch=wire_uint(data, "epoch", "conviction"),
            step=wire_uint(data, "step", "conviction"),
            trainer=check_client_id(data.get("trainer"), "conviction.trainer"),
            batch=BatchId.from_wire(data.get("batch")),
            verifiers=tuple(check_client_id(v, "conviction.verifiers[]") for v in verifiers),
            agreement_milli=_agreement(data, "conviction"),
        )


@dataclass
class VerificationRecord:
    accusations: list[Accusation] = field(default_factory=list)
    convictions: list[Conviction] = field(default_factory=list)
    equivocations: list[Equivocation] = field(default_factory=list)
    """Proven equivocations (`coordinator.equivocation`)."""

    def excluded(self, trainer: bytes, epoch: int, step: int) -> bool:
        """Whether results of `trainer` trained at `step` of `epoch` must not be applied."""
        return any(
            c.trainer == trainer and c.epoch == epoch and c.step <= step for c in self.convictions
        )

    def equivocated(self, trainer: bytes, epoch: int, step: int) -> bool:
        """Whether `trainer` was proven to equivocate in `epoch` with its results of `step`
        not yet final then: they must not be applied."""
        return any(
            e.trainer == trainer and e.epoch == epoch and e.step <= step for e in self.equivocations
        )

    def ever_equivocated(self, client_id: bytes) -> bool:
        """Whether `client_id` was ever proven to equivocate (it is not admitted again)."""
        return any(e.trainer == client_id for e in self.equivocations)

    def ever_convicted(self, client_id: bytes) -> bool:
        """Whether `client_id` has a conviction in the record (it is not admitted again)."""
        return any(c.trainer == client_id for c in self.convictions)

    def convicted(self, trainer: bytes, epoch: int) -> Conviction | None:
        for conviction in self.convictions:
            if conviction.trainer == trainer and conviction.epoch == epoch:
                return conviction
        return None

    def to_wire(self) -> dict[str, Any]:
        return {
            "accusations": [a.to_wire() for a in self.accusations],
            "convictions": [c.to_wire() for c in self.convictions],
            "equivocations": [e.to_wire() for e in self.equivocations],
        }

    @classmethod
    def from_wire(cls, data: Any) -> VerificationRecord:
        if data is None:  # coordinators from before verification existed
            return cls()
        data = wire_map(data, "verification")
        accusations = wire_list(data, "accusations", "verification")
        convictions = wire_list(data, "convictions", "verification")
        # optional: coordinators from before equivocation proofs existed have none
        equivocations = (
            wire_list(data, "equivocations", "verification") if ("equivocations" in data) else []
        )
        if (
            len(accusations) > MAX_ACCUSATIONS
            or len(convictions) > MAX_CONVICTIONS
            or len(equivocations) > MAX_EQUIVOCATIONS
        ):
            raise ValueError("verification holds too many accusations or convictions")
        return cls(
            [Accusation.from_wire(a) for a in accusations],
            [Conviction.from_wire(c) for c in convictions],
            [Equivocation.from_wire(e) for e in equivocations],
        )

    def to_toml(self) -> dict[str, Any]:
        """The state.toml table: ids as hex strings. Pending accusations are not saved (a
        restarted server starts a new epoch, where they mean nothing)."""
        convictions = []
        for conviction in self.convictions:
            entry = conviction.to_wire()
            entry["trainer"] = conviction.trainer.hex()
            entry["verifiers"] = [v.hex() for v in conviction.verifiers]
            convictions.append(entry)
        equivocations = []
        for equivocation in self.equivocations:
            proven = equivocation.to_wire()
            proven["trainer"] = equivocation.trainer.hex()
            equivocations.append(proven)
        return {"convictions": convictions, "equivocations": equivocations}

    @classmethod
    def from_toml(cls, table: Any) -> VerificationRecord:
        if table is None:
            return cls()
        try:
            table = wire_map(table, "verification")
            convictions = []
            for entry in wire_list(table, "convictions", "verification"):
                entry = {**wire_map(entry, "conviction")}
                entry["trainer"] = bytes.fromhex(str(entry.get("trainer", "")))
                entry["verifiers"] = [bytes.fromhex(str(v)) for v in entry.get("verifiers", [])]
                convictions.append(entry)
            equivocations = []
            for entry in table.get("equivocations", []):
                entry = {**wire_map(entry, "equivocation")}
                entry["trainer"] = bytes.fromhex(str(entry.get("trainer", "")))
                equivocations.append(entry)
            return cls.from_wire(
                {"accusations": [], "convictions": convictions, "equivocations": equivocations}
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"state file verification is not valid: {exc}") from exc
