"""Verifiers in the whole-run coordinator simulation: how often the conviction rules convict
an honest client, and how fast they remove liars and cheats, honest and adaptive (pure, fake
clock).

`VerifyingRun` is a `SimulatedRun` whose members also play the verifier role: once a round's
verifier sample is revealed (its RoundWitness), every elected verifier reports on each batch
of its sample, through the coordinator's real `accuse` / `attest`. An honest verifier accuses
exactly the results that fail the check (what the measured check does: docs/verification.md)
and passes the others; an honest result fails by bad luck with probability `unlucky` (the
measured rate of honest tiny-batch checks below the threshold), and verifiers are
deterministic, so every verifier that samples such a result accuses it. Commitments are a hash
of (step, trainer, batch), the same for every verifier, as one announced result is, and decide
the bad luck. Removed keys join again at the next WaitingForMembers (ban expiry is part of
what is measured). The members, in id order (`Roles`):

- `liars` accuse every result they check;
- `cheats` fail the check with every result;
- `selective` cheat (fail the check) only in rounds where they predict that no verifier will
  sample their batches, from what is public when they train: with `hidden_sample` (the
  coordinator's rule) the sample seed is fresh randomness revealed after they published, and
  their prediction (`predicted_sample_seed`, exact when the seed was public) is a guess;
- `shielders` verify honestly except that they pass every result of the cheats (colluders);
- `sole_liars` accuse the batches that no other verifier of the round checks, and pass the
  others honestly (never refuted, since nobody else checked).

`measure` runs one seed.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from psyche_common.batch_id import BatchId
from psyche_common.coordinator import (
    Accusation,
    Attestation,
    Conviction,
    ConvictionKind,
    Coordinator,
    CoordinatorError,
    ErrorKind,
    Round,
    RunState,
)
from psyche_common.coordinator.transitions import derive_sample_secret
from psyche_common.coordinator.verification import (
    checkers_of,
    round_verifiers,
    verifier_sample,
)
from psyche_common.coordinator.witnesses import attested_trainers

from bench.study.coordinator_sim import RoundRecord, SimulatedRun, client_id
from bench.support.run_configs import make_coordinator


@dataclass(frozen=True)
class Roles:
    liars: frozenset[bytes] = frozenset()
    cheats: frozenset[bytes] = frozenset()
    selective: frozenset[bytes] = frozenset()
    shielders: frozenset[bytes] = frozenset()
    sole_liars: frozenset[bytes] = frozenset()

    @property
    def attackers(self) -> frozenset[bytes]:
        return self.liars | self.cheats | self.selective | self.shielders | self.sole_liars

    @property
    def cheating(self) -> frozenset[bytes]:
        return self.cheats | self.selective

    @property
    def lying_verifiers(self) -> frozenset[bytes]:
        return self.liars | self.shielders | self.sole_liars


@dataclass
class VerificationStats:
    steps: int = 0
    reports: int = 0
    refused: int = 0
    false_convictions: int = 0
    """Honest trainers convicted by verifiers (what must stay 0)."""
    false_convictions_by_lies: int = 0
    """Of those, the convictions that a lie carried: one of the convicting verifiers' counted
    strikes came from a step where it accused a result of that trainer that passed the check
    (the rest rest on honest accusations only: a result failing twice by bad luck)."""
    honest_accusers_removed: int = 0
    """Honest verifiers removed as false accusers or false passers (what must stay 0)."""
    liar_removals: list[int] = field(default_factory=list)
    """The step of each removal of a lying verifier (liar, shielder, sole liar)."""
    cheat_convictions: list[int] = field(default_factory=list)
    liar_checks: int = 0
    """Batches a liar checked (and accused)."""
    old_rule_false_convictions: int = 0
    """The baseline: honest trainers the first rule (a strict majority of the trainer's
    checkers in a round, so a lone checker's accusation) would have convicted."""
    unlucky_results: int = 0
    """Honest results that failed the check by bad luck (each accused by all its checkers)."""
    twice_unlucky: int = 0
    """(epoch, trainer) pairs with two or more such results: the only way the rule can
    convict an honest trainer without a lying verifier (two verifiers each saw two)."""
    one_step_rule: set[tuple[int, bytes]] = field(default_factory=set)
    """The (epoch start, honest trainer) pairs whose strikes named two verifiers at some point: what
    the rule before the step rule (two verifiers, even of one step) would have convicted."""
    two_step_rule: set[tuple[int, bytes]] = field(default_factory=set)
    """The (epoch start, honest trainer) pairs whose strikes named two verifiers and two steps:
    what the previous rule (any two verifiers across any two steps) would have convicted."""
    cheat_training_rounds: int = 0
    """Rounds in which a cheat (or selective cheat) was assigned batches."""
    cheat_rounds: int = 0
    """Of those, the rounds in which it cheated."""
    cheated_unchecked: int = 0
    """Of those, the rounds in which no verifier sampled its batches (it went unseen)."""
    cheated_applied: int = 0
    """Of the cheated rounds, those whose results were applied: neither refused
    (`VerificationRecord.refused`) nor skipped for a conviction of that step or earlier."""
    cheat_results_refused: int = 0
    """Cheated rounds whose results were refused before the cheat's conviction."""
    honest_results_refused: int = 0
    """Honest trainers' rounds whose results were refused (what an honest result's bad luck,
    or a liar's word with one, costs)."""


def predicted_sample_seed(round_: Round) -> bytes:
    """What a trainer can compute of a round's sample seed from the broadcast when the round
    starts: exact when the coordinator derives the seed from public values (no secret passed,
    the rule before the hidden sample), a guess when the server draws it in secret."""
    seed = round_.next_random_seed if round_.height > 0 else round_.random_seed
    return derive_sample_secret(seed, round_.height)


class VerifyingRun(SimulatedRun):
    def __init__(
        self,
        coord: Coordinator,
        rng: random.Random,
        roles: Roles,
        unlucky: float = 0.0,
        hidden_sample: bool = True,
    ) -> None:
        super().__init__(coord, rng)
        self.roles = roles
        self.unlucky = unlucky
        self.hidden_sample = hidden_sample
        self.stats = VerificationStats()
        self._unlucky_seen: set[bytes] = set()
        self._unlucky_of: dict[tuple[int, bytes], int] = {}
        self._cheated: dict[tuple[int, int], set[bytes]] = {}
        self._verified: set[tuple[int, int]] = set()
        self._lies: set[tuple[int, bytes, bytes]] = set()
        """(step, verifier, trainer) of every accusation of a result that passed the check."""
        self._cheated_steps: set[tuple[int, int, bytes]] = set()
        """(epoch, step, trainer) of every round a cheat cheated in."""
        self.refusals: set[tuple[int, bytes]] = set()
        """(step, trainer) of every refused result (steps count on across epochs; the record
        keeps a refusal until the next epoch starts, after the epoch number moved on)."""
        self._convictions_seen: set[int] = set()
        self.convictions: list[Conviction] = []
        """Every conviction made, in order: the record drops an epoch's when the next starts."""

    def sample_secret(self) -> bytes | None:
        return self.rng.randbytes(32) if self.hidden_sample else None

    def _fails_by_bad_luck(self, commitment: bytes, trainer: bytes) -> bool:
        if int.from_bytes(commitment[:8], "little") >= self.unlucky * 2**64:
            return False
        if commitment not in self._unlucky_seen:
            self._unlucky_seen.add(commitment)
            self.stats.unlucky_results += 1
            key = (self.coord.epoch_state.start_timestamp, trainer)
            self._unlucky_of[key] = self._unlucky_of.get(key, 0) + 1
            if self._unlucky_of[key] == 2:
                self.stats.twice_unlucky += 1
        return True

    def _new_round(self, view: Coordinator) -> RoundRecord:
        record = super()._new_round(view)
        if record.training:
            self._decide_cheats(view, record)
        return record

    def _round(self, view: Coordinator) -> None:
        key = self.round_key(view)
        record = self.rounds.get(key)
        revealed = view.run_state == RunState.RoundWitness and key not in self._verified
        if revealed and record is not None and record.training:
            self._verified.add(key)
            self._verify(view, record)
        super()._round(view)

    def _verifiers(self, view: Coordinator) -> list[bytes]:
        round_ = view.current_round()
        config = view.config
        return round_verifiers(
            view.epoch_state.clients,
            round_.random_seed,
            config.witness_nodes,
            config.verification_percent,
            round_.tie_breaker_tasks,
        )

    def _decide_cheats(self, view: Coordinator, record: RoundRecord) -> None:
        """Which cheats cheat this round: always, or (selective) when their prediction of
        the sample leaves their batches unchecked."""
        verifiers = self._verifiers(view)
        guess = predicted_sample_seed(view.current_round())
        cheated = set()
        for trainer in set(record.assignment.values()) & self.roles.cheating:
            self.stats.cheat_training_rounds += 1
            if trainer in self.roles.cheats or not checkers_of(
                trainer, record.assignment, verifiers, guess
            ):
                cheated.add(trainer)
                self.stats.cheat_rounds += 1
        self._cheated[record.key] = cheated

    def _verify(self, view: Coordinator, record: RoundRecord) -> None:
        round_ = view.current_round()
        sample_seed = round_.sample_seed
        assert round_.sample_revealed and sample_seed
        verifiers = self._verifiers(view)
        step = view.progress.step
        cheated = self._cheated.get(record.key, set())
        self._cheated_steps |= {(view.progress.epoch, step, trainer) for trainer in cheated}
        for trainer in cheated:
            if not checkers_of(trainer, record.assignment, verifiers, sample_seed):
                self.stats.cheated_unchecked += 1
        for trainer in set(record.assignment.values()) - cheated:
            checkers = checkers_of(trainer, record.assignment, verifiers, sample_seed)
            lying = [v for v in checkers if v in self.roles.liars and self.clients[v].acting]
            if checkers and 2 * len(lying) > len(checkers):
                self.stats.old_rule_false_convictions += 1
        batches = list(record.assignment)
        samples = {v: verifier_sample(sample_seed, v, batches, verifiers) for v in verifiers}
        for verifier in verifiers:
            if not self.clients[verifier].acting:
                continue
            for batch in samples[verifier]:
                trainer = record.assignment[batch]
                commitment = hashlib.sha256(
                    step.to_bytes(8, "little") + trainer + batch.start.to_bytes(8, "little")
                ).digest()
                fails = trainer in cheated or self._fails_by_bad_luck(commitment, trainer)
                accuse = self._accuses(verifier, trainer, batch, fails, samples)
                if accuse and not fails:
                    self._lies.add((step, verifier, trainer))
                try:
                    if accuse:
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

    def _accuses(
        self,
        verifier: bytes,
        trainer: bytes,
        batch: BatchId,
        fails: bool,
        samples: dict[bytes, list[BatchId]],
    ) -> bool:
        roles = self.roles
        if verifier in roles.liars:
            self.stats.liar_checks += 1
            return True
        if verifier in roles.shielders and trainer in roles.cheating:
            return False
        if verifier in roles.sole_liars:
            alone = not any(batch in s for v, s in samples.items() if v != verifier)
            if alone:
                self.stats.liar_checks += 1
                return True
        return fails

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

    def collect_convictions(self) -> None:
        """Keep each new conviction, and for one of an honest trainer by verifiers: did a lie
        carry it? (The strikes it rests on are still the epoch's when it is made.) Kept, a
        conviction's id is never reused, so `_convictions_seen` stays sound."""
        record = self.coord.verification
        for conviction in record.convictions:
            if id(conviction) in self._convictions_seen:
                continue
            self._convictions_seen.add(id(conviction))
            self.convictions.append(conviction)
            trainer = conviction.trainer
            if conviction.kind != ConvictionKind.VERIFIERS or trainer in self.roles.attackers:
                continue
            strikes = record.strikes.get(trainer, {})
            if any(
                (step, verifier, trainer) in self._lies
                for verifier in conviction.verifiers
                for step in strikes.get(verifier, ())
            ):
                self.stats.false_convictions_by_lies += 1

    def count_refusals(self) -> None:
        """Split the refused results into the cheats' and the honest trainers', and count the
        cheated rounds whose results were applied all the same."""
        stats = self.stats
        refused = {(e, s, t) for e, s, t in self._cheated_steps if (s, t) in self.refusals}
        stats.cheat_results_refused = len(refused)
        stats.honest_results_refused = sum(
            1 for _, trainer in self.refusals if trainer not in self.roles.attackers
        )
        convicted = [
            (c.epoch, c.step, c.trainer)
            for c in self.convictions
            if c.kind in (ConvictionKind.VERIFIERS, ConvictionKind.PROVEN)
        ]
        stats.cheated_applied = sum(
            1
            for epoch, step, trainer in self._cheated_steps - refused
            if not any(e == epoch and s <= step and t == trainer for e, s, t in convicted)
        )

    def server_tick(self) -> None:
        if self.coord.run_state == RunState.WaitingForMembers:
            for cid, client in self.clients.items():
                if client.connected and cid not in self.pending:
                    self.pending[cid] = None  # removed keys come back for the next epoch
        super().server_tick()
        self.collect_convictions()
        for step, trainers in self.coord.verification.refused.items():
            self.refusals |= {(step, trainer) for trainer in trainers}
        epoch = self.coord.epoch_state.start_timestamp
        for trainer, by_verifier in self.coord.verification.strikes.items():
            if len(by_verifier) < 2:
                continue
            if trainer in self.roles.attackers:
                continue
            self.stats.one_step_rule.add((epoch, trainer))
            if len({s for by_step in by_verifier.values() for s in by_step}) >= 2:
                self.stats.two_step_rule.add((epoch, trainer))


def measure(
    seed: int,
    members: int = 8,
    percent: int = 25,
    liars: int = 1,
    cheats: int = 0,
    total_steps: int = 200,
    unlucky: float = 0.0,
    *,
    selective: int = 0,
    shielders: int = 0,
    sole_liars: int = 0,
    hidden_sample: bool = True,
) -> VerificationStats:
    """One run of `total_steps` steps with `members` clients, the first of them attackers in
    the order of `Roles` (`liars`, `cheats`, `selective` cheats, `shielders` of the cheats,
    `sole_liars`); each honest result fails the check with probability `unlucky`.
    `hidden_sample=False` runs the rule before the hidden sample (the seed public when the
    round starts)."""
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
    counts = (liars, cheats, selective, shielders, sole_liars)
    groups: list[frozenset[bytes]] = []
    start = 0
    for count in counts:
        groups.append(frozenset(ids[start : start + count]))
        start += count
    roles = Roles(*groups)
    run = VerifyingRun(coord, random.Random(seed), roles, unlucky, hidden_sample)
    for cid in ids:
        run.join(cid)
    assert run.run_until(lambda: coord.run_state == RunState.Finished, 40 * total_steps)
    stats = run.stats
    stats.steps = coord.progress.step
    run.collect_convictions()
    run.count_refusals()
    for conviction in run.convictions:
        if conviction.kind == ConvictionKind.VERIFIERS:
            if conviction.trainer in roles.cheating:
                stats.cheat_convictions.append(conviction.step)
            elif conviction.trainer not in roles.attackers:
                stats.false_convictions += 1
        elif conviction.kind in (ConvictionKind.FALSE_ACCUSER, ConvictionKind.FALSE_PASSER):
            if conviction.trainer in roles.lying_verifiers:
                stats.liar_removals.append(conviction.step)
            elif conviction.trainer not in roles.attackers:
                stats.honest_accusers_removed += 1
    return stats
