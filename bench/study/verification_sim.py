"""Verifiers in the whole-run coordinator simulation: how often the conviction rules convict
an honest trainer, and how fast they remove liars and cheats (pure, fake clock).

`VerifyingRun` is a `SimulatedRun` whose members also play the verifier role: in each round,
every elected verifier reports on each batch of its sample, through the coordinator's real
`accuse` / `attest`. An honest verifier accuses exactly the results of `cheats` (what the
measured check does: docs/verification.md) and passes the others, except that an honest
result fails the check by bad luck with probability `unlucky` (the measured rate of honest
tiny-batch checks below the threshold); verifiers are deterministic, so every verifier that
samples such a result accuses it. A verifier in `liars` accuses every result it checks.
Commitments are a hash of (step, trainer, batch), the same for every verifier, as one
announced result is, and decide the bad luck. Removed keys join again at the next
WaitingForMembers (ban expiry is part of what is measured). `measure` runs one seed.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from psyche_common.coordinator import (
    Accusation,
    Attestation,
    ConvictionKind,
    Coordinator,
    CoordinatorError,
    ErrorKind,
    RunState,
)
from psyche_common.coordinator.verification import (
    checkers_of,
    round_verifiers,
    verifier_sample,
)
from psyche_common.coordinator.witnesses import attested_trainers

from bench.study.coordinator_sim import RoundRecord, SimulatedRun, client_id
from bench.support.run_configs import make_coordinator


@dataclass
class VerificationStats:
    steps: int = 0
    reports: int = 0
    refused: int = 0
    false_convictions: int = 0
    """Honest trainers convicted by verifiers (what must stay 0)."""
    honest_accusers_removed: int = 0
    liar_removals: list[int] = field(default_factory=list)
    """The step of each removal of a liar (as a refuted false accuser)."""
    cheat_convictions: list[int] = field(default_factory=list)
    liar_checks: int = 0
    """Batches a liar checked (and accused)."""
    old_rule_false_convictions: int = 0
    """The baseline: honest trainers the previous rule (a strict majority of the trainer's
    checkers in a round, so a lone checker's accusation) would have convicted."""
    unlucky_results: int = 0
    """Honest results that failed the check by bad luck (each accused by all its checkers)."""
    one_step_rule: set[tuple[int, bytes]] = field(default_factory=set)
    """The (epoch start, honest trainer) pairs whose strikes named two verifiers at some point: what
    the rule before the step rule (two verifiers, even of one step) would have convicted."""
    cheat_one_step_rule: dict[tuple[int, bytes], int] = field(default_factory=dict)
    """The same for cheats: (epoch start, cheat) → the step at which that rule convicted it."""


class VerifyingRun(SimulatedRun):
    def __init__(
        self,
        coord: Coordinator,
        rng: random.Random,
        liars: frozenset[bytes] = frozenset(),
        cheats: frozenset[bytes] = frozenset(),
        unlucky: float = 0.0,
    ) -> None:
        super().__init__(coord, rng)
        self.liars = liars
        self.cheats = cheats
        self.unlucky = unlucky
        self.stats = VerificationStats()
        self._unlucky_seen: set[bytes] = set()

    def _fails_by_bad_luck(self, commitment: bytes) -> bool:
        if int.from_bytes(commitment[:8], "little") >= self.unlucky * 2**64:
            return False
        if commitment not in self._unlucky_seen:
            self._unlucky_seen.add(commitment)
            self.stats.unlucky_results += 1
        return True

    def _new_round(self, view: Coordinator) -> RoundRecord:
        record = super()._new_round(view)
        if record.training:
            self._verify(view, record)
        return record

    def _verify(self, view: Coordinator, record: RoundRecord) -> None:
        round_ = view.current_round()
        config = view.config
        verifiers = round_verifiers(
            view.epoch_state.clients,
            round_.random_seed,
            config.witness_nodes,
            config.verification_percent,
            round_.tie_breaker_tasks,
        )
        step = view.progress.step
        for trainer in set(record.assignment.values()) - self.cheats:
            checkers = checkers_of(trainer, record.assignment, verifiers, round_.random_seed)
            lying = [v for v in checkers if v in self.liars and self.clients[v].acting]
            if checkers and 2 * len(lying) > len(checkers):
                self.stats.old_rule_false_convictions += 1
        for verifier in verifiers:
            if not self.clients[verifier].acting:
                continue
            for batch in verifier_sample(round_.random_seed, verifier, list(record.assignment)):
                trainer = record.assignment[batch]
                commitment = hashlib.sha256(
                    step.to_bytes(8, "little") + trainer + batch.start.to_bytes(8, "little")
                ).digest()
                lying = verifier in self.liars
                self.stats.liar_checks += lying
                fails = trainer in self.cheats or self._fails_by_bad_luck(commitment)
                try:
                    if lying or fails:
                        self.coord.accuse(
                            verifier, Accusation(step, verifier, trainer, batch, 50, commitment)
                        )
                    else:
                        self.coord.attest(
                            verifier, Attestation(step, verifier, trainer, batch, 950, commitment)
                        )
                    self.stats.reports += 1
                except CoordinatorError as exc:
                    assert exc.kind == ErrorKind.InvalidAccusation, exc
                    self.stats.refused += 1  # e.g. a removed liar's later reports

    def _health_checks(self, view: Coordinator) -> None:
        """As the client does with verifiers: no health check across a membership change or
        without the attested round (its committee indices would name other members)."""
        previous = view.previous_round()
        if previous is None or previous.clients_len != len(view.epoch_state.clients):
            return
        if attested_trainers(view) is None:
            return
        super()._health_checks(view)

    def kick_unhealthy(self) -> None:
        """Removed keys stay out of their epoch, but may wait for the next one: the previous
        epoch's exited clients are not kicked while the run waits for members (kicked, a
        removed liar and cheat left 6 of 8 waiting, below `init_min_clients`, for good)."""
        if self.coord.run_state != RunState.WaitingForMembers:
            super().kick_unhealthy()

    def server_tick(self) -> None:
        if self.coord.run_state == RunState.WaitingForMembers:
            for cid, client in self.clients.items():
                if client.connected and cid not in self.pending:
                    self.pending[cid] = None  # removed keys come back for the next epoch
        super().server_tick()
        epoch = self.coord.epoch_state.start_timestamp
        for trainer, by_verifier in self.coord.verification.strikes.items():
            if len(by_verifier) < 2:
                continue
            if trainer in self.cheats:  # judged when the next step's witnesses came in
                self.stats.cheat_one_step_rule.setdefault(
                    (epoch, trainer), self.coord.progress.step - 1
                )
            else:
                self.stats.one_step_rule.add((epoch, trainer))


def measure(
    seed: int,
    members: int = 8,
    percent: int = 25,
    liars: int = 1,
    cheats: int = 0,
    total_steps: int = 200,
    unlucky: float = 0.0,
) -> VerificationStats:
    """One run of `total_steps` steps with `members` clients, `liars` of them lying verifiers
    and `cheats` of them trainers whose every result fails the check; each honest result fails
    it with probability `unlucky`."""
    coord = make_coordinator(
        model={"max_seq_len": 64},
        verification_percent=percent,
        total_steps=total_steps,
        epoch_time=120,
        init_min_clients=members - 1,
        min_clients=2,
        witness_nodes=2,
        global_batch_size_start=2 * members,
        global_batch_size_end=2 * members,
    )
    ids = [client_id(f"{seed}-{i}") for i in range(members)]
    run = VerifyingRun(
        coord,
        random.Random(seed),
        liars=frozenset(ids[:liars]),
        cheats=frozenset(ids[liars : liars + cheats]),
        unlucky=unlucky,
    )
    for cid in ids:
        run.join(cid)
    assert run.run_until(lambda: coord.run_state == RunState.Finished, 40 * total_steps)
    stats = run.stats
    stats.steps = coord.progress.step
    for conviction in coord.verification.convictions:
        if conviction.kind == ConvictionKind.VERIFIERS:
            if conviction.trainer in run.cheats:
                stats.cheat_convictions.append(conviction.step)
            else:
                stats.false_convictions += 1
        elif conviction.kind == ConvictionKind.FALSE_ACCUSER:
            if conviction.trainer in run.liars:
                stats.liar_removals.append(conviction.step)
            else:
                stats.honest_accusers_removed += 1
    return stats
