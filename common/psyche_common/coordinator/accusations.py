"""Verification reports: accept verifiers' accusations and attestations, judge them once their
step closes, convict on agreement of independent verifiers, remove outvoted verifiers.

Rules (docs/verification.md):

- a report (`Accusation`: the result fails the check; `Attestation`: it passes) names a step
  whose verifier sample is revealed: the current round's once it is in RoundWitness, or the
  previous round's while the current one is still in RoundTrain; its sender is a `Verifier`
  of that round that has not lost its standing, the batch is in the sender's own sample
  (`verifier_sample` of the round's revealed `sample_seed` and verifiers) and was assigned to the named
  trainer; one report per verifier, step and batch;
- a step is judged when it closes to reports (`judge_closed_step`: the next round enters
  RoundWitness, or the epoch's Cooldown begins), before any client may apply its results.
  For each checked batch, the side with more verifiers wins (a tie decides nothing): the
  accusations *stand* when the accusers outnumber the passers, and every verifier on the
  losing side that reported the very result (same commitment) the winners did is outvoted by
  each of them (`refuted_by`): an accuser by the passers, a passer by the accusers;
- a verifier outvoted by `REFUTERS` different verifiers, on the results of `REFUTED_TRAINERS`
  different trainers, in the epoch loses its standing (a liar contradicts the others about
  everyone; colluders that outvote an honest checker do so about the one cheat they shield): a
  `FALSE_ACCUSER` or `FALSE_PASSER` conviction, it becomes Dropped and its accusations count
  no more;
- each standing accusation is a strike against its trainer (verifier, step); a trainer is
  convicted (`VERIFIERS`) once `MIN_ACCUSERS` different verifiers each struck it at
  `MIN_STRIKE_STEPS` different steps of the epoch, each of them with at least one *checkable*
  strike against it (`VerificationRecord.confirmed`: another accuser of the same check
  confirmed it, or its step's round elected no other verifier; an accusation of a batch that
  nobody else checked, in a step with other verifiers, is what a lying verifier can always
  make unopposed, so it never convicts on its own): Dropped, and every client skips its results
  from the judged step on in this epoch (`VerificationRecord.excluded`). Before that, once
  verifiers of `MIN_ACCUSERS` different keys have checkable strikes against a trainer, each
  further result of it whose accusations stand is refused (`VerificationRecord.refused`: no
  client applies it; the trainer stays), so a cheat's results stop counting from the second
  independent accuser on rather than from its conviction. A verifier's
  accusation thus needs corroboration by its own accusation at another step (a lone liar's
  word, or one honest result failing by bad luck, which every checker accuses in that step,
  never counts twice), and one verifier never convicts;
- both kinds are scoped to the epoch: the next epoch admits the key again. Only self-proving
  evidence (`convict_proven`, e.g. two signed conflicting commitments) bans it for good
  (`VerificationRecord.bans`, never evicted by later convictions; `VerificationRecord.banned`,
  `transitions.tick_waiting_for_members`).
"""

from __future__ import annotations

from collections.abc import Callable

from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id
from psyche_common.coordinator.assignment import assign_data_for_round
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import ClientState, Round, RunState
from psyche_common.coordinator.verdicts import (
    MAX_ACCUSATIONS,
    MAX_CONVICTIONS,
    MAX_TALLIES,
    Accusation,
    Attestation,
    Conviction,
    ConvictionKind,
    Strikes,
)
from psyche_common.coordinator.verification import (
    MIN_ACCUSERS,
    MIN_STRIKE_STEPS,
    REFUTED_TRAINERS,
    REFUTERS,
    round_verifiers,
    verifier_sample,
)

Report = Accusation | Attestation


def _refuse(detail: str) -> CoordinatorError:
    return CoordinatorError(ErrorKind.InvalidAccusation, detail)


def round_of_open_step(
    coord: CoordinatorState,
    step: int,
    refuse: Callable[[str], CoordinatorError] = _refuse,
    what: str = "accusations",
) -> Round:
    """The round of `step` while its results are still open (the current step, or the one
    before it during RoundTrain with the same members); else `refuse(why)` is raised."""
    if coord.run_state not in (RunState.RoundTrain, RunState.RoundWitness):
        raise refuse(f"run is {coord.run_state.name}, not in a round")
    current_step = coord.progress.step
    if step == current_step:
        return coord.current_round()
    previous = coord.previous_round()
    if step + 1 == current_step and coord.run_state == RunState.RoundTrain and previous:
        if coord.round_clients(previous) is None:
            raise refuse(f"the members changed since step {step}; it can no longer be judged")
        return previous
    raise refuse(f"step {step} is closed to {what} (current step {current_step})")


def _check_report(coord: CoordinatorState, from_id: bytes, report: Report) -> None:
    """Raise `CoordinatorError(InvalidAccusation)` naming the rule `report` breaks."""
    if report.verifier != from_id:
        raise _refuse(f"{short_id(from_id)} sent a report signed as another verifier")
    record = coord.verification
    if record.convicted(from_id, coord.progress.epoch) is not None:
        raise _refuse(f"{short_id(from_id)} was convicted this epoch and has no standing")
    round_ = round_of_open_step(coord, report.step)
    clients = coord.round_clients(round_) or []
    config = coord.config
    verifiers = round_verifiers(
        clients,
        round_.random_seed,
        config.witness_nodes,
        config.verification_percent,
        round_.tie_breaker_tasks,
    )
    if from_id not in verifiers:
        raise _refuse(f"{short_id(from_id)} is not a verifier of step {report.step}")
    record.committee_sizes[report.step] = len(verifiers)
    if not (round_.sample_revealed and round_.sample_seed):
        raise _refuse(f"the verifier sample of step {report.step} is not revealed yet")
    assignments = assign_data_for_round(round_, clients, config, coord.model.max_seq_len)
    sample = verifier_sample(round_.sample_seed, from_id, list(assignments), verifiers)
    if report.batch not in sample:
        raise _refuse(
            f"{short_id(from_id)} did not have to check {report.batch} at step {report.step}"
        )
    if assignments.get(report.batch) != report.trainer:
        raise _refuse(
            f"{report.batch} of step {report.step} was not assigned to {short_id(report.trainer)}"
        )
    if any(
        r.step == report.step and r.verifier == from_id and r.batch == report.batch
        for r in record.reports()
    ):
        raise _refuse(f"{short_id(from_id)} already reported on {report.batch}")
    if len(record.accusations) + len(record.attestations) >= MAX_ACCUSATIONS:
        raise _refuse(f"{MAX_ACCUSATIONS} reports pending")


def accuse(coord: CoordinatorState, from_id: bytes, accusation: Accusation) -> None:
    """Record `accusation` (its `verifier` must be `from_id`); it is judged when its step
    closes (`judge_closed_step`). Raises `CoordinatorError(InvalidAccusation)`."""
    _check_report(coord, from_id, accusation)
    coord.verification.accusations.append(accusation)


def attest(coord: CoordinatorState, from_id: bytes, attestation: Attestation) -> None:
    """Record that `from_id` checked a result and it passed (same rules as `accuse`)."""
    _check_report(coord, from_id, attestation)
    coord.verification.attestations.append(attestation)


def judge_closed_step(coord: CoordinatorState) -> list[Conviction]:
    """Judge the reports of step `progress.step - 1`, which just closed to reports (the
    current round entered RoundWitness, or the Cooldown began); returns the convictions made.
    """
    step = coord.progress.step - 1
    record = coord.verification
    epoch = coord.progress.epoch
    reports = [r for r in record.reports() if r.step == step]
    record.accusations = [a for a in record.accusations if a.step != step]
    record.attestations = [a for a in record.attestations if a.step != step]
    by_batch: dict[tuple[bytes, BatchId], list[Report]] = {}
    for report in reports:
        if record.convicted(report.verifier, epoch) is None:
            by_batch.setdefault((report.trainer, report.batch), []).append(report)
    standing: list[Accusation] = []
    outvoted: dict[bytes, Report] = {}
    # a step whose round elected one verifier cannot confirm anything: its accusations count
    # as checkable; with more, only an accusation another accuser of the same check confirmed
    # (a colluder that stays silent does not make its liar's step a lone one)
    reporters = len({r.verifier for group in by_batch.values() for r in group})
    lone_verifier = record.committee_sizes.pop(step, reporters) < 2
    for (trainer, _), batch_reports in by_batch.items():
        accusers = [r for r in batch_reports if isinstance(r, Accusation)]
        passes = [r for r in batch_reports if isinstance(r, Attestation)]
        if len(accusers) > len(passes):
            standing.extend(accusers)
            if lone_verifier or len(accusers) >= MIN_ACCUSERS:
                _add(record.confirmed, trainer, {a.verifier for a in accusers})
            losers, winners = list[Report](passes), list[Report](accusers)
        elif len(passes) > len(accusers):
            losers, winners = list[Report](accusers), list[Report](passes)
        else:
            continue  # a tie decides nothing and counts against nobody
        for loser in losers:
            against = {
                w.verifier
                for w in winners
                if loser.commitment is not None and w.commitment == loser.commitment
            }
            if against:
                _add(record.refuted_by, loser.verifier, against)
                _add(record.outvoted_about, loser.verifier, {trainer})
                outvoted[loser.verifier] = loser
    convictions = [
        _convict_outvoted(coord, report, step)
        for verifier, report in sorted(outvoted.items())
        if len(record.refuted_by.get(verifier, ())) >= REFUTERS
        and len(record.outvoted_about.get(verifier, ())) >= REFUTED_TRAINERS
    ]
    struck = set()
    for accusation in standing:
        if record.convicted(accusation.verifier, epoch) is None:
            _strike(record.strikes, accusation.trainer, accusation.verifier, step)
            struck.add(accusation.trainer)
    for trainer in sorted(struck):
        strikes = record.strikes.get(trainer, {})
        checkable = record.confirmed.get(trainer, set())
        corroborated = {
            v for v, steps in strikes.items() if len(steps) >= MIN_STRIKE_STEPS and v in checkable
        }
        if record.convicted(trainer, epoch) is not None:
            continue
        if len(corroborated) < MIN_ACCUSERS:
            # not (yet) convicted, but suspected by two independent verifiers: this step's
            # result, which failed its check, is not applied (`VerificationRecord.refused`)
            if len({v for v in strikes if v in checkable}) >= MIN_ACCUSERS:
                record.refuse(trainer, step)
        else:
            mine = [a for a in standing if a.trainer == trainer]
            conviction = Conviction(
                epoch=epoch,
                step=step,
                trainer=trainer,
                batch=min((a.batch for a in mine), key=_batch_key),
                verifiers=tuple(sorted(corroborated)),
                agreement_milli=min(a.agreement_milli for a in mine),
            )
            record_conviction(coord, conviction)
            convictions.append(conviction)
    return convictions


def convict_proven(
    coord: CoordinatorState, trainer: bytes, step: int, batch: BatchId, reporter: bytes
) -> Conviction:
    """Convict `trainer` on self-proving evidence about its result for `batch` at `step` that
    `reporter` sent and the caller has checked (e.g. two announcements it signed that name
    different commitments for one batch: docs/verification.md). Such a conviction needs no
    second verifier and bars the key from every later epoch too. Idempotent per epoch."""
    epoch = coord.progress.epoch
    for existing in coord.verification.convictions:
        if existing.trainer == trainer and existing.epoch == epoch and existing.proven:
            return existing
    conviction = Conviction(
        epoch=epoch,
        step=step,
        trainer=trainer,
        batch=batch,
        verifiers=(reporter,),
        agreement_milli=0,
        kind=ConvictionKind.PROVEN,
    )
    record_conviction(coord, conviction)
    return conviction


def _convict_outvoted(coord: CoordinatorState, report: Report, step: int) -> Conviction:
    """Remove the verifier of `report`, outvoted by `REFUTERS` different verifiers this epoch
    (`report`: the last of its reports they outvoted)."""
    record = coord.verification
    verifier = report.verifier
    conviction = Conviction(
        epoch=coord.progress.epoch,
        step=step,
        trainer=verifier,
        batch=report.batch,
        verifiers=tuple(sorted(record.refuted_by[verifier])),
        agreement_milli=report.agreement_milli,
        kind=ConvictionKind.FALSE_ACCUSER
        if isinstance(report, Accusation)
        else ConvictionKind.FALSE_PASSER,
    )
    record_conviction(coord, conviction)
    for accusers in record.strikes.values():  # its accusations count no more
        accusers.pop(verifier, None)
    for confirmed in record.confirmed.values():
        confirmed.discard(verifier)
    return conviction


def record_conviction(coord: CoordinatorState, conviction: Conviction) -> None:
    """Keep `conviction` and drop its key from the epoch (it leaves at the next round start)."""
    record = coord.verification
    record.convictions.append(conviction)
    del record.convictions[:-MAX_CONVICTIONS]
    if conviction.proven:
        record.ban(conviction)  # False when `MAX_BANS` are kept: for this epoch only (logged)
    for client in coord.epoch_state.clients:
        if client.id == conviction.trainer and client.state == ClientState.Healthy:
            client.state = ClientState.Dropped


def _add(tally: dict[bytes, set[bytes]], key: bytes, values: set[bytes]) -> bool:
    """Add `values` to `tally[key]` within `MAX_TALLIES`; True if it grew."""
    if key not in tally and len(tally) >= MAX_TALLIES:
        return False
    entry = tally.setdefault(key, set())
    before = len(entry)
    entry |= set(sorted(values - entry)[: MAX_TALLIES - before])
    return len(entry) > before


def _strike(strikes: Strikes, trainer: bytes, verifier: bytes, step: int) -> None:
    """Add a strike of `verifier` at `step` against `trainer`, within `MAX_TALLIES` trainers
    and verifiers. Each verifier keeps its first `MIN_STRIKE_STEPS` steps: whenever all the
    strikes span that many steps, the kept ones do too (a verifier with more keeps that many;
    otherwise every step is kept), so the verdict is the same, and a lone accuser's strikes
    stay bounded however long the epoch."""
    if trainer not in strikes and len(strikes) >= MAX_TALLIES:
        return
    by_verifier = strikes.setdefault(trainer, {})
    if verifier not in by_verifier and len(by_verifier) >= MAX_TALLIES:
        return
    steps = by_verifier.setdefault(verifier, set())
    if len(steps) < MIN_STRIKE_STEPS:
        steps.add(step)


def _batch_key(batch: BatchId) -> tuple[int, int]:
    return batch.start, batch.end


def prune(coord: CoordinatorState) -> None:
    """Forget reports of steps that can no longer be judged (called at round starts)."""
    oldest = coord.progress.step - 1
    record = coord.verification
    record.accusations = [a for a in record.accusations if a.step >= oldest]
    record.attestations = [a for a in record.attestations if a.step >= oldest]
    record.committee_sizes = {s: n for s, n in record.committee_sizes.items() if s >= oldest}
