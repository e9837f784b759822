"""Errors raised by the coordinator's methods (the reference's `CoordinatorError` kinds)."""

from __future__ import annotations

import enum
import re


class ErrorKind(enum.Enum):
    """The reference's `CoordinatorError` variants (and `NotCheckpointer`, `InvalidAccusation`: ours)."""

    NoActiveRound = 0
    InvalidWitness = 1
    InvalidRunState = 2
    DuplicateWitness = 3
    InvalidHealthCheck = 4
    Halted = 5
    WitnessesFull = 6
    CannotResume = 7
    InvalidWithdraw = 8
    InvalidCommitteeSelection = 9
    InvalidCommitteeProof = 10
    NotCheckpointer = 11
    """Ours: a `Checkpoint` from a key the operator did not name as a checkpointer."""
    InvalidAccusation = 12
    """Ours: a verification report the rules refuse (not a variant of the reference)."""
    InvalidEquivocation = 13
    """Ours: an equivocation proof that proves nothing (`coordinator.equivocation`)."""

    @property
    def text(self) -> str:
        """Display text: the name's words split by spaces ("Witnesses full")."""
        words = re.findall(r"[A-Z][a-z]*", self.name)
        return " ".join([words[0], *(w.lower() for w in words[1:])])


class CoordinatorError(Exception):
    """A rejected coordinator call; `kind` says which rule refused it."""

    def __init__(self, kind: ErrorKind, detail: str = "") -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind.text}: {detail}" if detail else kind.text)
