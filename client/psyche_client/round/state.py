"""What a client remembers about one coordinator round (reference §2.5.1 step 6).

A `RoundState` is created at the start of every RoundTrain from the derived roles. During the
round (and the next one, as "previous round") it collects the announced results per batch in
arrival order, the verified and decoded payloads, the Finished messages, the witness blooms
and this client's own unquantized results (for the next step's error feedback).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psyche_common.assignment import BatchId
from psyche_common.bloom import Bloom

from psyche_client.round.consensus import Candidate
from psyche_client.round.roles import RoundRoles
from psyche_client.round.witness_builder import RoundWitnessState


def new_bloom(_num_items: int) -> Bloom:
    """A witness bloom with fresh random keys (the reference ignores the sizing hint)."""
    return Bloom.random()


@dataclass
class RoundState:
    roles: RoundRoles
    witness: RoundWitnessState
    have_training: bool
    candidates: dict[BatchId, list[Candidate]] = field(default_factory=dict)
    announcements: dict[bytes, Any] = field(default_factory=dict)
    payloads: dict[bytes, Any] = field(default_factory=dict)
    downloads: dict[bytes, asyncio.Task[None]] = field(default_factory=dict)
    failed: set[bytes] = field(default_factory=set)
    finished_from: set[bytes] = field(default_factory=set)
    self_results: list[Any] = field(default_factory=list)
    own_announcements: list[Any] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    tokens_trained: int = 0
    training_done: bool = False
    cancelled: bool = False
    sent_finished: bool = False
    sent_witness: bool = False
    started_at: float = 0.0
    training_finished_at: float | None = None

    @classmethod
    def start(
        cls,
        roles: RoundRoles,
        num_clients: int,
        have_training: bool,
        now: float,
        bloom_factory: Callable[[int], Any] = new_bloom,
    ) -> RoundState:
        witness = RoundWitnessState.new(roles.batch_ids, num_clients, bloom_factory)
        return cls(roles=roles, witness=witness, have_training=have_training, started_at=now)

    @property
    def step(self) -> int:
        return self.roles.step

    @property
    def height(self) -> int:
        return self.roles.height

    @property
    def batches_left(self) -> int:
        return max(0, len(self.roles.my_batches) - len(self.self_results))

    def downloads_settled(self) -> bool:
        """Every download of this round has finished (verified, decoded, or given up)."""
        return all(task.done() for task in self.downloads.values())

    def mean_loss(self) -> float | None:
        return sum(self.losses) / len(self.losses) if self.losses else None
