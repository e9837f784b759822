"""Verification reports: accept an accusation from a round's verifier, convict on a quorum.

Rules (docs/verification.md):

- an accusation names a step that is the current round's (RoundTrain or RoundWitness) or the
  previous round's while the current one is still in RoundTrain: once a round's witnesses are
  in (RoundWitness), the results of the round before it may already be applied, so the set of
  convictions that can affect them is closed;
- its sender is a `Verifier` of that round, the batch is in the sender's own sample
  (`verifier_sample`) and was assigned to the accused trainer; one accusation per verifier,
  trainer and step;
- a trainer is convicted once `conviction_quorum(checkers)` of the verifiers that checked it
  in that round accused it: it becomes Dropped (it leaves the epoch at the next round start,
  like a health-check drop) and a `Conviction` is kept; every client skips its results of that
  step and later ones in this epoch (`VerificationRecord.excluded`), and no later epoch admits
  it (`transitions.tick_waiting_for_members`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id
from psyche_common.coordinator.assignment import assign_data_for_round
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.types import ClientState, Round, RunState
from psyche_common.coordinator.verdicts import (
    MAX_ACCUSATIONS,
    MAX_CONVICTIONS,
    Accusation,
    Conviction,
)
from psyche_common.coordinator.verification import (
    checkers_of,
    conviction_quorum,
    round_verifiers,
    verifier_sample,
)

if TYPE_CHECKING:
    from psyche_common.coordinator.state import Coordinator


def _refuse(detail: str) -> CoordinatorError:
    return CoordinatorError(ErrorKind.InvalidAccusation, detail)


def _round_of_step(coord: Coordinator, step: int) -> Round:
    if coord.run_state not in (RunState.RoundTrain, RunState.RoundWitness):
        raise _refuse(f"run is {coord.run_state.name}, not in a round")
    current_step = coord.progress.step
    if step == current_step:
        return coord.current_round()
    previous = coord.previous_round()
    if step + 1 == current_step and coord.run_state == RunState.RoundTrain and previous:
        if previous.clients_len != len(coord.epoch_state.clients):
            raise _refuse(f"the members changed since step {step}; it can no longer be judged")
        return previous
    raise _refuse(f"step {step} is closed to accusations (current step {current_step})")


def accuse(coord: Coordinator, from_id: bytes, accusation: Accusation) -> Conviction | None:
    """Record `accusation` (its `verifier` must be `from_id`); returns the conviction it
    completes, if any. Raises `CoordinatorError(InvalidAccusation)` naming the rule broken."""
    if accusation.verifier != from_id:
        raise _refuse(f"{short_id(from_id)} sent an accusation signed as another verifier")
    round_ = _round_of_step(coord, accusation.step)
    clients = coord.epoch_state.clients
    config = coord.config
    verifiers = round_verifiers(
        clients,
        round_.random_seed,
        config.witness_nodes,
        config.verification_percent,
        round_.tie_breaker_tasks,
    )
    if from_id not in verifiers:
        raise _refuse(f"{short_id(from_id)} is not a verifier of step {accusation.step}")
    assignments = assign_data_for_round(round_, clients, config, coord.model.max_seq_len)
    sample = verifier_sample(round_.random_seed, from_id, list(assignments))
    if accusation.batch not in sample:
        raise _refuse(
            f"{short_id(from_id)} did not have to check {accusation.batch} at step "
            f"{accusation.step}"
        )
    if assignments.get(accusation.batch) != accusation.trainer:
        raise _refuse(
            f"{accusation.batch} of step {accusation.step} was not assigned to "
            f"{short_id(accusation.trainer)}"
        )
    record = coord.verification
    if any(
        a.step == accusation.step and a.verifier == from_id and a.trainer == accusation.trainer
        for a in record.accusations
    ):
        raise _refuse(f"{short_id(from_id)} already accused {short_id(accusation.trainer)}")
    if len(record.accusations) >= MAX_ACCUSATIONS:
        raise _refuse(f"{MAX_ACCUSATIONS} accusations pending")
    record.accusations.append(accusation)
    if record.convicted(accusation.trainer, coord.progress.epoch) is not None:
        return None
    accusers = [
        a
        for a in record.accusations
        if a.step == accusation.step and a.trainer == accusation.trainer
    ]
    checkers = checkers_of(accusation.trainer, assignments, verifiers, round_.random_seed)
    if len(accusers) < conviction_quorum(len(checkers)):
        return None
    conviction = Conviction(
        epoch=coord.progress.epoch,
        step=accusation.step,
        trainer=accusation.trainer,
        batch=min((a.batch for a in accusers), key=_batch_key),
        verifiers=tuple(a.verifier for a in accusers),
        agreement_milli=min(a.agreement_milli for a in accusers),
    )
    record.convictions.append(conviction)
    del record.convictions[:-MAX_CONVICTIONS]
    for client in clients:
        if client.id == accusation.trainer and client.state == ClientState.Healthy:
            client.state = ClientState.Dropped
    return conviction


def _batch_key(batch: BatchId) -> tuple[int, int]:
    return batch.start, batch.end


def prune(coord: Coordinator) -> None:
    """Forget accusations of steps that can no longer be judged (called at round starts)."""
    oldest = coord.progress.step - 1
    coord.verification.accusations = [a for a in coord.verification.accusations if a.step >= oldest]
