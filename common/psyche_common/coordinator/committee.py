"""Committee and witness selection for one round (reference section 4.1), with proofs.

Roles come only from the round's random seed: `seed32 = SHA256(u64_le(seed))`, then the
swap-or-not permutation seeded by `SHA256(seed32 || "committee")` gives committee positions and
the one seeded by `SHA256(seed32 || "witness")` gives witness positions. A node's index is its
position in `epoch_state.clients`.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.shuffle import compute_shuffled_index, shuffled_positions
from psyche_common.wire_checks import wire_map, wire_uint

MAX_WITNESSES = 32
U64_MAX = (1 << 64) - 1


class CommitteeSelectionError(ValueError):
    """The inputs cannot form a committee selection (`InvalidCommitteeSelection`)."""


class Committee(enum.IntEnum):
    """A node's role in a round (the reference's numbering)."""

    TieBreaker = 0
    Verifier = 1
    Trainer = 2


@dataclass(frozen=True)
class CommitteeProof:
    """Where a node sits in the committee permutation: its committee, position and index."""

    committee: Committee
    position: int
    index: int

    def to_wire(self) -> dict[str, Any]:
        return {"committee": int(self.committee), "position": self.position, "index": self.index}

    @classmethod
    def from_wire(cls, data: Any) -> CommitteeProof:
        data = wire_map(data, "committee proof")
        committee = wire_uint(data, "committee", "committee proof")
        if committee not in Committee._value2member_map_:
            raise ValueError(f"committee proof.committee: unknown committee {committee}")
        return cls(
            Committee(committee),
            wire_uint(data, "position", "committee proof"),
            wire_uint(data, "index", "committee proof"),
        )


@dataclass(frozen=True)
class WitnessProof:
    """Where a node sits in the witness permutation, and whether that makes it a witness."""

    position: int
    index: int
    witness: bool

    def to_wire(self) -> dict[str, Any]:
        return {"position": self.position, "index": self.index, "witness": self.witness}

    @classmethod
    def from_wire(cls, data: Any) -> WitnessProof:
        data = wire_map(data, "witness proof")
        witness = data.get("witness")
        if isinstance(witness, int):  # a u8 in the reference; accept 0/1 as well as bools
            witness = bool(witness)
        if not isinstance(witness, bool):
            raise ValueError(f"witness proof.witness must be a bool, got {witness!r:.80}")
        return cls(
            wire_uint(data, "position", "witness proof"),
            wire_uint(data, "index", "witness proof"),
            witness,
        )


class HasId(Protocol):
    """Anything with a 32-byte client id (epoch members)."""

    id: bytes


class SelectionRound(Protocol):
    """What a selection reads from a round (`types.Round` has it)."""

    @property
    def tie_breaker_tasks(self) -> int: ...

    @property
    def clients_len(self) -> int: ...

    @property
    def random_seed(self) -> int: ...


class SelectionConfig(Protocol):
    """The `[config]` settings a selection reads (`CoordinatorConfig` has them)."""

    @property
    def witness_nodes(self) -> int: ...

    @property
    def verification_percent(self) -> int: ...


class RoundHistory(Protocol):
    """A coordinator's config and its last three rounds (`CoordinatorState` is one)."""

    @property
    def config(self) -> SelectionConfig: ...

    def current_round(self) -> SelectionRound: ...

    def previous_round(self) -> SelectionRound | None: ...

    def previous_previous_round(self) -> SelectionRound | None: ...


def seed32_from_u64(seed: int) -> bytes:
    return hashlib.sha256((seed & U64_MAX).to_bytes(8, "little")).digest()


@dataclass(frozen=True)
class CommitteeSelection:
    """The committee and witness selection of one round, derived from its random seed."""

    tie_breaker_nodes: int
    verifier_nodes: int
    witness_nodes: int
    total_nodes: int
    seed: bytes
    committee_seed: bytes
    witness_seed: bytes

    @classmethod
    def new(
        cls,
        tie_breaker_nodes: int,
        witness_nodes: int,
        verification_percent: int,
        total_nodes: int,
        seed: int,
    ) -> CommitteeSelection:
        if total_nodes >= U64_MAX:
            raise CommitteeSelectionError(f"total_nodes {total_nodes} is too large")
        if total_nodes < tie_breaker_nodes:
            raise CommitteeSelectionError(
                f"total_nodes {total_nodes} < tie_breaker_nodes {tie_breaker_nodes}"
            )
        if witness_nodes != 0 and total_nodes < witness_nodes:
            raise CommitteeSelectionError(
                f"total_nodes {total_nodes} < witness_nodes {witness_nodes}"
            )
        if verification_percent > 100:
            raise CommitteeSelectionError(f"verification_percent {verification_percent} > 100")
        verifier_nodes = ((total_nodes - tie_breaker_nodes) * verification_percent) // 100
        seed32 = seed32_from_u64(seed)
        return cls(
            tie_breaker_nodes=tie_breaker_nodes,
            verifier_nodes=verifier_nodes,
            witness_nodes=witness_nodes,
            total_nodes=total_nodes,
            seed=seed32,
            committee_seed=hashlib.sha256(seed32 + b"committee").digest(),
            witness_seed=hashlib.sha256(seed32 + b"witness").digest(),
        )

    @classmethod
    def from_coordinator(cls, coordinator: RoundHistory, offset: int) -> CommitteeSelection:
        """Selection for the current (0), previous (-1) or previous-previous (-2) round.

        Raises `CoordinatorError(NoActiveRound)` when that round does not exist and
        `CoordinatorError(InvalidCommitteeSelection)` when its inputs are inconsistent.
        """
        round_: SelectionRound | None
        if offset == 0:
            round_ = coordinator.current_round()
        elif offset == -1:
            round_ = coordinator.previous_round()
        elif offset == -2:
            round_ = coordinator.previous_previous_round()
        else:
            round_ = None
        if round_ is None:
            raise CoordinatorError(ErrorKind.NoActiveRound, f"no round at offset {offset}")
        try:
            return cls.new(
                round_.tie_breaker_tasks,
                coordinator.config.witness_nodes,
                coordinator.config.verification_percent,
                round_.clients_len,
                round_.random_seed,
            )
        except CommitteeSelectionError as exc:
            raise CoordinatorError(ErrorKind.InvalidCommitteeSelection, str(exc)) from exc

    @property
    def trainer_nodes(self) -> int:
        return self.total_nodes - self.tie_breaker_nodes - self.verifier_nodes

    def _committee_of_position(self, position: int) -> Committee:
        if position < self.tie_breaker_nodes:
            return Committee.TieBreaker
        if position < self.tie_breaker_nodes + self.verifier_nodes:
            return Committee.Verifier
        return Committee.Trainer

    def _is_witness_position(self, position: int) -> bool:
        limit = self.witness_nodes if self.witness_nodes != 0 else MAX_WITNESSES
        return position < limit

    def get_committee(self, index: int) -> CommitteeProof:
        position = compute_shuffled_index(index, self.total_nodes, self.committee_seed)
        return CommitteeProof(self._committee_of_position(position), position, index)

    def get_witness(self, index: int) -> WitnessProof:
        position = compute_shuffled_index(index, self.total_nodes, self.witness_seed)
        return WitnessProof(position, index, self._is_witness_position(position))

    def all_committees(self) -> list[Committee]:
        """The committee of every index `0..total_nodes-1` (batched hashing)."""
        positions = shuffled_positions(self.total_nodes, self.committee_seed)
        return [self._committee_of_position(p) for p in positions]

    def all_witness_flags(self) -> list[bool]:
        """Whether each index `0..total_nodes-1` is a witness (batched hashing)."""
        positions = shuffled_positions(self.total_nodes, self.witness_seed)
        return [self._is_witness_position(p) for p in positions]

    def verify_committee(self, proof: CommitteeProof) -> bool:
        if not 0 <= proof.index < self.total_nodes:
            return False
        return self.get_committee(proof.index) == proof

    def verify_witness(self, proof: WitnessProof) -> bool:
        if not 0 <= proof.index < self.total_nodes:
            return False
        return self.get_witness(proof.index) == proof

    def verify_committee_for_client(
        self, client_id: bytes, proof: CommitteeProof, clients: Sequence[HasId]
    ) -> bool:
        return _index_is(client_id, proof.index, clients) and self.verify_committee(proof)

    def verify_witness_for_client(
        self, client_id: bytes, proof: WitnessProof, clients: Sequence[HasId]
    ) -> bool:
        return _index_is(client_id, proof.index, clients) and self.verify_witness(proof)


def _index_is(client_id: bytes, index: int, clients: Sequence[HasId]) -> bool:
    return 0 <= index < len(clients) and clients[index].id == client_id
