"""A whole run on a fake clock: one coordinator, a server shell and simulated clients.

The server shell does what `psyche_server` does around the coordinator: a pending set in join
order, the kick of exited non-Healthy clients before every tick, withdraw on disconnect, and a
fresh random seed per call. Simulated clients read the coordinator state (optionally through
`to_wire`/`from_wire`, as real clients do) and send warmup witnesses, round witnesses with real
blooms of the trainers whose results they "received", and health checks for trainers that no
quorum saw. A client can disconnect (withdrawn by the server) or go silent (stays connected,
stops sending and training: its peers must accuse it).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom
from psyche_common.coordinator import (
    ClientState,
    Coordinator,
    CoordinatorError,
    ErrorKind,
    RunState,
    TickResult,
    Witness,
    witness_quorum,
)
from psyche_common.coordinator.assignment import assign_data_for_state
from psyche_common.coordinator.committee import Committee, CommitteeSelection, WitnessProof
from psyche_common.coordinator.witnesses import attested_trainers

ALLOWED_TRANSITIONS = {
    RunState.WaitingForMembers: {RunState.Warmup, RunState.Paused},
    RunState.Warmup: {
        RunState.RoundTrain,
        RunState.WaitingForMembers,
        RunState.Finished,
        RunState.Paused,
    },
    # RoundTrain → WaitingForMembers/Finished: a Warmup timeout that starts round 0 and then
    # finds too few clients in the same tick.
    RunState.RoundTrain: {RunState.RoundWitness, RunState.WaitingForMembers, RunState.Finished},
    RunState.RoundWitness: {RunState.RoundTrain, RunState.Cooldown},
    RunState.Cooldown: {RunState.WaitingForMembers, RunState.Finished, RunState.Paused},
    RunState.Paused: {RunState.WaitingForMembers, RunState.Finished},
}


def client_id(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


@dataclass
class SimClient:
    id: bytes
    connected: bool = True
    silent: bool = False
    warmed_epoch: int | None = None  # start time of the epoch of its last warmup witness
    witnessed: set[tuple[int, int]] = field(default_factory=set)
    accused_at: set[tuple[int, int]] = field(default_factory=set)

    @property
    def acting(self) -> bool:
        return self.connected and not self.silent


@dataclass
class RoundRecord:
    key: tuple[int, int]  # (epoch start time, height)
    training: bool
    assignment: dict[BatchId, bytes]
    delivered: set[bytes]


class SimulatedRun:
    """Drives `coord` with simulated clients; every `step()` advances the clock by `dt`."""

    def __init__(
        self,
        coord: Coordinator,
        rng: random.Random,
        *,
        start: int = 1_000_000,
        via_wire: bool = False,
        witness_probability: float = 1.0,
        warmup_probability: float = 1.0,
    ) -> None:
        self.coord = coord
        self.rng = rng
        self.now = start
        self.via_wire = via_wire
        self.witness_probability = witness_probability
        self.warmup_probability = warmup_probability
        self.clients: dict[bytes, SimClient] = {}
        self.pending: dict[bytes, None] = {}
        self.rounds: dict[tuple[int, int], RoundRecord] = {}
        self.transitions: list[tuple[RunState, RunState, int]] = []
        self.results: list[TickResult] = []
        self.dropped_by_health_check: list[bytes] = []
        self.max_step = coord.progress.step
        self.max_cursor = self.data_cursor()
        self._install_transition_recorder()

    # ----- the server shell -----

    def _install_transition_recorder(self) -> None:
        original: Callable[[int, RunState], None] = self.coord.change_state

        def recording_change_state(now: int, new_state: RunState) -> None:
            old = self.coord.run_state
            original(now, new_state)
            self.transitions.append((old, new_state, now))

        self.coord.change_state = recording_change_state  # type: ignore[method-assign]

    def seed(self) -> int:
        return self.rng.getrandbits(64)

    def sample_secret(self) -> bytes | None:
        """The verifier-sample secret passed with each tick (the server passes 32 random
        bytes; None: the coordinator derives it from the tick's seed)."""
        return None

    def join(self, cid: bytes) -> None:
        client = self.clients.setdefault(cid, SimClient(cid))
        client.connected, client.silent = True, False
        self.pending[cid] = None

    def disconnect(self, cid: bytes) -> None:
        client = self.clients[cid]
        client.connected = False
        self.pending.pop(cid, None)
        index = self.coord.client_index(cid)
        if index is not None:
            try:
                self.coord.withdraw(index)
            except CoordinatorError as exc:
                assert exc.kind == ErrorKind.InvalidWithdraw

    def go_silent(self, cid: bytes) -> None:
        self.clients[cid].silent = True

    def kick_unhealthy(self) -> None:
        for exited in self.coord.epoch_state.exited_clients:
            if exited.state != ClientState.Healthy:
                self.pending.pop(exited.id, None)

    def server_tick(self) -> None:
        self.kick_unhealthy()
        try:
            result = self.coord.tick(
                list(self.pending), self.now, self.seed(), sample_secret=self.sample_secret()
            )
        except CoordinatorError as exc:
            assert exc.kind == ErrorKind.Halted
            return
        self.results.append(result)

    # ----- the clients -----

    def view(self) -> Coordinator:
        return Coordinator.from_wire(self.coord.to_wire()) if self.via_wire else self.coord

    def round_key(self, view: Coordinator) -> tuple[int, int]:
        """(epoch start time, height): unique even when an abandoned epoch is retried."""
        return (view.epoch_state.start_timestamp, view.current_round().height)

    def clients_act(self) -> None:
        view = self.view()
        state = view.run_state
        if state == RunState.Warmup:
            self._warmup(view)
        elif state in (RunState.RoundTrain, RunState.RoundWitness):
            self._round(view)

    def _members(self, view: Coordinator) -> list[SimClient]:
        return [self.clients[c.id] for c in view.epoch_state.clients if c.id in self.clients]

    def _warmup(self, view: Coordinator) -> None:
        for client in self._members(view):
            if not client.acting or client.warmed_epoch == view.epoch_state.start_timestamp:
                continue
            if self.rng.random() > self.warmup_probability:
                continue  # still loading the model
            index = view.client_index(client.id)
            witness = Witness(WitnessProof(position=index, index=index, witness=False))
            self.coord.warmup_witness(
                client.id, witness, self.now, self.seed(), self.sample_secret()
            )
            client.warmed_epoch = view.epoch_state.start_timestamp
            if self.coord.run_state != RunState.Warmup:
                return

    def _new_round(self, view: Coordinator) -> RoundRecord:
        key = self.round_key(view)
        training = view.is_training_round()
        assignment = assign_data_for_state(view) if training else {}
        if training:
            check_assignment(view, assignment)
        # Trainers that are acting now deliver their results to everyone.
        delivered = {owner for owner in assignment.values() if self.clients[owner].acting}
        record = RoundRecord(key, training, assignment, delivered)
        self.rounds[key] = record
        return record

    def _round(self, view: Coordinator) -> None:
        key = self.round_key(view)
        if key not in self.rounds:
            self._new_round(view)
            self._health_checks(view)
        epoch, height = key
        previous = self.rounds.get((epoch, height - 1))
        seen = previous.delivered if previous is not None else set()
        selection = CommitteeSelection.from_coordinator(view, 0)
        for index, member in enumerate(view.epoch_state.clients):
            client = self.clients.get(member.id)
            if client is None or not client.acting or key in client.witnessed:
                continue
            proof = selection.get_witness(index)
            if not proof.witness or self.rng.random() > self.witness_probability:
                continue
            self.coord.witness(client.id, self.make_witness(proof, seen, height), self.now)
            client.witnessed.add(key)
            if self.coord.run_state != view.run_state:
                return

    def make_witness(self, proof: WitnessProof, seen: set[bytes], height: int) -> Witness:
        if height == 0:  # round 0 witnesses have nothing to report yet
            return Witness(proof)
        participant = Bloom.random(self.rng)
        participant.add_all(hashlib.sha256(cid).digest() for cid in sorted(seen))
        return Witness(proof, participant, Bloom.random(self.rng), bytes(32))

    def _health_checks(self, view: Coordinator) -> None:
        current = view.current_round()
        previous = view.previous_round()
        if current.height < 2 or previous is None:
            return
        key = self.round_key(view)
        quorum = witness_quorum(view.config.witness_nodes, len(previous.witnesses))
        selection = CommitteeSelection.from_coordinator(view, -1)
        previous_witness_ids = {
            view.epoch_state.clients[w.proof.index].id
            for w in previous.witnesses
            if w.proof.index < len(view.epoch_state.clients)
        }
        attested = attested_trainers(view)  # the trainers that had a result to be seen
        checks = []
        for index, member in enumerate(view.epoch_state.clients[: previous.clients_len]):
            proof = selection.get_committee(index)
            if proof.committee != Committee.Trainer:
                continue
            if attested is not None and member.id not in attested:
                continue
            if view.trainer_health_score(member.id, previous.witnesses) < quorum:
                checks.append((member.id, proof))
        if not checks:
            return
        for accuser_id in sorted(previous_witness_ids):
            accuser = self.clients.get(accuser_id)
            if accuser is None or not accuser.acting or key in accuser.accused_at:
                continue
            accuser.accused_at.add(key)
            before = {
                c.id for c in self.coord.epoch_state.clients if c.state == ClientState.Healthy
            }
            dropped = self.coord.health_check(accuser_id, checks)  # honest: never rejected
            newly = [cid for cid, _ in checks if cid in before]
            assert dropped == len(set(newly))
            self.dropped_by_health_check.extend(dict.fromkeys(newly))

    # ----- driving and invariants -----

    def data_cursor(self) -> int:
        if self.coord.run_state in (RunState.RoundTrain, RunState.RoundWitness, RunState.Cooldown):
            return self.coord.current_round().data_index
        return self.coord.progress.epoch_start_data_index

    def check_invariants(self) -> None:
        coord = self.coord
        for old, new, _ in self.transitions:
            assert new != old and new in ALLOWED_TRANSITIONS[old], (old, new)
        assert coord.progress.step >= self.max_step, "step went backwards"
        self.max_step = coord.progress.step
        cursor = self.data_cursor()
        assert cursor >= self.max_cursor, "data cursor went backwards"
        self.max_cursor = cursor
        es = coord.epoch_state
        assert len(es.clients) <= 256 and len(es.exited_clients) <= 256
        assert len({c.id for c in es.clients}) == len(es.clients), "duplicate member"
        assert all(len(r.witnesses) <= 32 for r in es.rounds)
        if coord.run_state in (RunState.RoundTrain, RunState.RoundWitness):
            assert coord.current_round().clients_len == len(es.clients)

    def step(self, dt: int = 1) -> None:
        self.now += dt
        self.clients_act()
        self.server_tick()
        self.check_invariants()

    def run_until(self, predicate: Callable[[], bool], max_steps: int, dt: int = 1) -> bool:
        for _ in range(max_steps):
            if predicate():
                return True
            self.step(dt)
        return predicate()


def check_assignment(view: Coordinator, assignment: dict[BatchId, bytes]) -> None:
    """Every sample of the round's global batch belongs to exactly one trainer."""
    round_ = view.current_round()
    batch_size = view.batch_size_at(round_.data_index)
    covered = sorted(i for batch in assignment for i in range(batch.start, batch.end + 1))
    trainers = len(assignment)
    expected = list(range(round_.data_index, round_.data_index + batch_size)) if trainers else []
    assert covered == expected, "a sample is unassigned or assigned twice"
    members = {c.id for c in view.epoch_state.clients}
    assert set(assignment.values()) <= members
