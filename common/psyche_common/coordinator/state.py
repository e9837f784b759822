"""The coordinator's state: `CoordinatorState`, its fields, read-only helpers and the small
state primitives every rule module uses (the bottom of the coordinator package).

The rules that change it sit above it, each taking the state: `transitions` (tick, pause,
resume), `witnesses`, `accusations`, `equivocation`, `checkpoints`, `misconduct`, `resume`;
the (de)serialization is `wire`; `machine.Coordinator` on top is the state with every input as
a method. Nothing here does I/O: the clock (`now`, unix seconds) and randomness (`seed`, u64)
are arguments.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Self

from psyche_common.config import CoordinatorConfig, LLMConfig, seconds_to_ms
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.health import health_score
from psyche_common.coordinator.types import (
    ACTIVE_STATES,
    HALTED_STATES,
    MAX_WITNESSES,
    NUM_STORED_ROUNDS,
    Client,
    ClientState,
    EpochState,
    Progress,
    Round,
    RunState,
    Witness,
)
from psyche_common.coordinator.verdicts import VerificationRecord


class CoordinatorInvariantError(RuntimeError):
    """A transition to the state the coordinator is already in: a bug, never bad input."""


def to_ms(now: float) -> int:
    """Unix seconds (float) as whole unix milliseconds (floor)."""
    return int(now * 1000)


@dataclass
class CoordinatorState:
    """The whole coordinator state; `run_state_start_ms` is when `run_state` began (unix ms).

    The clock (`now`) is unix seconds as a float; state starts and timeouts are kept in whole
    milliseconds, so a round ends when its time is up rather than at the next whole second.
    """

    run_id: str
    run_state: RunState
    model: LLMConfig
    config: CoordinatorConfig
    progress: Progress = field(default_factory=Progress)
    epoch_state: EpochState = field(default_factory=EpochState)
    run_state_start_ms: int = 0
    pending_pause: bool = False
    verification: VerificationRecord = field(default_factory=VerificationRecord)

    @property
    def run_state_start_unix_timestamp(self) -> int:
        """When `run_state` began, in whole unix seconds (the saved state's unit)."""
        return self.run_state_start_ms // 1000

    @run_state_start_unix_timestamp.setter
    def run_state_start_unix_timestamp(self, seconds: int) -> None:
        self.run_state_start_ms = int(seconds) * 1000

    def copy(self) -> Self:
        return copy.deepcopy(self)

    def withdraw(self, index: int) -> None:
        """Mark the Healthy client at `index` Withdrawn (else `InvalidWithdraw`)."""
        clients = self.epoch_state.clients
        if not 0 <= index < len(clients) or clients[index].state != ClientState.Healthy:
            raise CoordinatorError(
                ErrorKind.InvalidWithdraw,
                f"index {index} is not a Healthy client (epoch has {len(clients)} clients)",
            )
        clients[index].state = ClientState.Withdrawn

    def withdraw_all(self) -> None:
        for client in self.epoch_state.clients:
            if client.state == ClientState.Healthy:
                client.state = ClientState.Withdrawn

    # ----- read-only helpers -----

    def halted(self) -> bool:
        return self.run_state in HALTED_STATES

    def active(self) -> bool:
        return self.run_state in ACTIVE_STATES

    def current_round(self) -> Round:
        return self.epoch_state.rounds[self.epoch_state.rounds_head]

    def previous_round(self) -> Round | None:
        """The round before the current one in this epoch, or None in round 0."""
        if self.current_round().height < 1:
            return None
        return self.epoch_state.rounds[(self.epoch_state.rounds_head - 1) % NUM_STORED_ROUNDS]

    def previous_previous_round(self) -> Round | None:
        """Two rounds back, or None before round 2 (the reference may return a zeroed slot)."""
        if self.current_round().height < 2:
            return None
        return self.epoch_state.rounds[(self.epoch_state.rounds_head - 2) % NUM_STORED_ROUNDS]

    def client_index(self, client_id: bytes) -> int | None:
        for index, client in enumerate(self.epoch_state.clients):
            if client.id == client_id:
                return index
        return None

    def round_clients(self, round_: Round) -> list[Client] | None:
        """The clients of a stored round of this epoch, when the only change since is clients
        seated mid-epoch (appended: the round's clients are then a prefix of today's); None
        when a client left since (indices no longer name the same clients)."""
        current = self.current_round().height
        seated_since = sum(
            r.seated for r in self.epoch_state.rounds if round_.height < r.height <= current
        )
        clients = self.epoch_state.clients
        if round_.clients_len + seated_since != len(clients):
            return None
        return clients[: round_.clients_len]

    def get_client_at_historical_index(self, index: int, previous_len: int) -> Client | None:
        """The client that had `index` in a round with `previous_len` clients, assuming the
        clients removed since then were at the tail (the reference's heuristic)."""
        clients, exited = self.epoch_state.clients, self.epoch_state.exited_clients
        if 0 <= index < len(clients):
            return clients[index]
        if len(clients) <= index < previous_len:
            back = previous_len - index - 1
            if back < len(exited):
                return exited[len(exited) - 1 - back]
        return None

    def witness_nodes_effective(self) -> int:
        """`config.witness_nodes`, or every client up to 32 when it is 0."""
        if self.config.witness_nodes != 0:
            return self.config.witness_nodes
        return min(len(self.epoch_state.clients), MAX_WITNESSES)

    def check_timeout(self, now: float, duration: float) -> bool:
        """True once `duration` seconds (whole, or whole milliseconds) have passed in this
        state (millisecond resolution), never at the very moment it began."""
        start = self.run_state_start_ms
        now_ms = to_ms(now)
        return now_ms != start and now_ms >= start + seconds_to_ms(duration)

    def check_epoch_timeout(self, now: float) -> bool:
        start = self.epoch_state.start_timestamp
        return int(now) != start and now >= start + self.config.epoch_time

    def last_step_set(self) -> bool:
        return self.epoch_state.last_step != 0

    def is_training_round(self) -> bool:
        """False for the two flush rounds started after the epoch timed out."""
        return not self.last_step_set()

    have_training = is_training_round

    def get_cold_start_warmup_bounds(self) -> tuple[int, int] | None:
        steps = self.model.cold_start_warmup_steps
        if self.epoch_state.cold_start_epoch and steps > 0:
            start = self.epoch_state.start_step
            return start, start + steps
        return None

    def trainer_health_score(self, client_id: bytes, round_witnesses: Sequence[Witness]) -> int:
        """How many witnesses saw `client_id`'s results (participant bloom of SHA-256(id))."""
        return health_score(client_id, [w.participant_bloom for w in round_witnesses])

    # ----- primitives used by the transition modules -----

    def change_state(self, now: float, new_state: RunState) -> None:
        if new_state == self.run_state:
            raise CoordinatorInvariantError(f"transition from {self.run_state.name} to itself")
        self.run_state = new_state
        self.run_state_start_ms = to_ms(now)

    def move_clients_to_exited(self, height: int) -> None:
        """Move every non-Healthy client to `exited_clients`, keeping the others' order.

        In Warmup the stored warmup witnesses are re-pointed at their sender's new index, and
        dropped when the sender left (their indices would otherwise go stale).
        """
        es = self.epoch_state
        new_index: dict[int, int] = {}
        kept: list[Client] = []
        for index, client in enumerate(es.clients):
            if client.state == ClientState.Healthy:
                new_index[index] = len(kept)
                kept.append(client)
            else:
                client.exited_height = height
                es.exited_clients.append(client)
        if len(kept) == len(es.clients):
            return
        es.clients = kept
        if self.run_state == RunState.Warmup:
            round_ = self.current_round()
            remapped = []
            for w in round_.witnesses:
                if w.proof.index in new_index:
                    w.proof = dataclasses.replace(w.proof, index=new_index[w.proof.index])
                    remapped.append(w)
            round_.witnesses = remapped
