"""Witness acceptance and health checks (reference sections 5.3–5.6).

Warmup witnesses end Warmup early once `witness_nodes_eff` arrived; round witnesses must carry
a valid witness proof and end RoundTrain early; health checks drop trainers that fewer than a
quorum of the previous round's witnesses saw in their participant blooms. A witness whose
blooms have more bits set than the round's clients can set is refused (`plausibility`), and
health checks are accepted only from the previous round's witnesses (ours, see
`health_check`). Both refusals that prove the sender lied (an implausible bloom, an accusation
of a healthy trainer) count against it, and enough of them remove it (`misconduct`).
"""

from __future__ import annotations

from collections.abc import Sequence

from psyche_common.client_id import short_id
from psyche_common.coordinator import shares, transitions
from psyche_common.coordinator.assignment import assign_data_for_round
from psyche_common.coordinator.committee import Committee, CommitteeProof, CommitteeSelection
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.misconduct import FALSE_REPORT_LIMIT, record_false_report
from psyche_common.coordinator.plausibility import check_witness_blooms, max_bloom_entries
from psyche_common.coordinator.quorum import witness_quorum
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import MAX_WITNESSES, ClientState, RunState, Witness


def _check_not_duplicate(coord: CoordinatorState, from_id: bytes) -> None:
    clients = coord.epoch_state.clients
    for stored in coord.current_round().witnesses:
        index = stored.proof.index
        if 0 <= index < len(clients) and clients[index].id == from_id:
            raise CoordinatorError(
                ErrorKind.DuplicateWitness, f"{short_id(from_id)} already witnessed this round"
            )


def _store(coord: CoordinatorState, witness: Witness) -> None:
    stored = coord.current_round().witnesses
    if len(stored) >= MAX_WITNESSES:
        raise CoordinatorError(ErrorKind.WitnessesFull, f"{MAX_WITNESSES} witnesses stored")
    stored.append(witness)


def warmup_witness(
    coord: CoordinatorState,
    from_id: bytes,
    witness: Witness,
    now: float,
    seed: int,
    sample_secret: bytes | None = None,
) -> None:
    """A client finished loading the model. Anyone in the epoch may send one."""
    if coord.halted():
        raise CoordinatorError(ErrorKind.Halted, f"run is {coord.run_state.name}")
    if coord.run_state == RunState.RoundTrain:
        return  # late: Warmup already ended
    if coord.run_state != RunState.Warmup:
        raise CoordinatorError(ErrorKind.InvalidRunState, f"run is {coord.run_state.name}")
    clients = coord.epoch_state.clients
    index = witness.proof.index
    if not 0 <= index < len(clients) or clients[index].id != from_id:
        raise CoordinatorError(
            ErrorKind.InvalidWitness,
            f"warmup witness from {short_id(from_id)} names client index {index}, "
            f"which is not its own",
        )
    _check_not_duplicate(coord, from_id)
    check_witness_blooms(witness, max_bloom_entries(coord), from_id)
    _store(coord, witness)
    if len(coord.current_round().witnesses) >= coord.witness_nodes_effective():
        transitions.start_round_train(coord, now, seed, 0, sample_secret)


def witness(coord: CoordinatorState, from_id: bytes, witness: Witness, now: float) -> None:
    """A round witness (its blooms describe the previous round's results)."""
    if coord.halted():
        raise CoordinatorError(ErrorKind.Halted, f"run is {coord.run_state.name}")
    if coord.run_state not in (RunState.RoundTrain, RunState.RoundWitness):
        raise CoordinatorError(ErrorKind.InvalidRunState, f"run is {coord.run_state.name}")
    selection = CommitteeSelection.from_coordinator(coord, 0)
    if not witness.proof.witness or not selection.verify_witness_for_client(
        from_id, witness.proof, coord.epoch_state.clients
    ):
        raise CoordinatorError(
            ErrorKind.InvalidWitness,
            f"{short_id(from_id)} is not the witness at index {witness.proof.index}",
        )
    _check_not_duplicate(coord, from_id)
    if not coord.config.per_client_shares:
        witness.result_ms = []  # timings serve only per-client shares
    try:
        check_witness_blooms(witness, max_bloom_entries(coord), from_id)
    except CoordinatorError:
        record_false_report(coord, from_id, FALSE_REPORT_LIMIT)  # no honest bloom is this full
        raise
    _store(coord, witness)
    if (
        len(coord.current_round().witnesses) >= coord.witness_nodes_effective()
        and coord.run_state != RunState.RoundWitness
    ):
        transitions.start_round_witness(coord, now)


def trainer_healthy(coord: CoordinatorState, client_id: bytes) -> bool:
    """Whether a quorum of the previous round's witnesses saw `client_id`'s results."""
    previous = coord.previous_round()
    if previous is None:
        raise CoordinatorError(ErrorKind.NoActiveRound, "no previous round")
    score = coord.trainer_health_score(client_id, previous.witnesses)
    return score >= witness_quorum(coord.config.witness_nodes, len(previous.witnesses))


def attested_trainers(coord: CoordinatorState) -> set[bytes] | None:
    """The trainers of the round the previous round's witnesses attest (two rounds back: a
    witness reports the results of the round before its own) that were given a batch, or None
    when that cannot be told (no such round, or the members changed since).

    Only they had a result the witnesses' blooms could hold. Without verifiers every member is
    a trainer every round; with them, a verifier of round h-2 that trains in round h-1 had no
    result to be seen. A round with more trainers than samples gives some trainers no batch:
    the reference judges those unseen and drops them, which also let an attacker who joined
    with many identities get honest trainers dropped; they are not judged here.
    """
    attested = coord.previous_previous_round()
    clients = None if attested is None else coord.round_clients(attested)
    if attested is None or clients is None:
        return None
    assignment = assign_data_for_round(attested, clients, coord.config, coord.model.max_seq_len)
    return set(assignment.values())


def healthy(coord: CoordinatorState, client_id: bytes, proof: CommitteeProof) -> bool:
    """Whether the previous-round member `client_id` (committee proof `proof`) was healthy.

    Raises `InvalidCommitteeProof` when the proof does not name that member.
    """
    previous = coord.previous_round()
    if previous is None:
        raise CoordinatorError(ErrorKind.NoActiveRound, "no previous round")
    if not 0 <= proof.index < previous.clients_len:
        raise CoordinatorError(
            ErrorKind.InvalidCommitteeProof,
            f"index {proof.index} is outside the previous round's {previous.clients_len} clients",
        )
    client = coord.get_client_at_historical_index(proof.index, previous.clients_len)
    selection = CommitteeSelection.from_coordinator(coord, -1)
    if (
        client is None
        or client.id != client_id
        or not selection.verify_committee_for_client(client.id, proof, coord.epoch_state.clients)
    ):
        raise CoordinatorError(
            ErrorKind.InvalidCommitteeProof,
            f"proof at index {proof.index} does not belong to {short_id(client_id)}",
        )
    if proof.committee == Committee.Trainer:
        attested = attested_trainers(coord)
        if attested is None and coord.config.verification_percent > 0:
            return True  # committees change per round: who had to deliver cannot be told
        if attested is not None and client.id not in attested:
            return True  # no result of its was due in the round the blooms attest
        if shares.forgiven(coord, client.id):
            return True  # a miss shrinks its share instead, up to the limit (per-client shares)
        return trainer_healthy(coord, client.id)
    return True  # tie-breakers and verifiers are not judged (the reference has todo!() here)


def _check_entitled_to_accuse(coord: CoordinatorState, from_id: bytes) -> None:
    """The sender must be a witness of the previous round: the round whose trainers are
    judged (its index in the epoch's client list, as `healthy` reads the proofs)."""
    previous = coord.previous_round()
    index = coord.client_index(from_id)
    entitled = False
    if previous is not None and index is not None and index < previous.clients_len:
        selection = CommitteeSelection.from_coordinator(coord, -1)
        entitled = selection.get_witness(index).witness
    if not entitled:
        raise CoordinatorError(
            ErrorKind.InvalidHealthCheck,
            f"health check from {short_id(from_id)}, which was not a witness of the previous "
            "round: only its witnesses may accuse",
        )


def health_check(
    coord: CoordinatorState, from_id: bytes, checks: Sequence[tuple[bytes, CommitteeProof]]
) -> int:
    """Drop every accused client; any accusation of a healthy client rejects them all.

    Only a witness of the previous round may accuse (ours: the reference accepts health
    checks from any connected key). Returns how many clients became Dropped.
    """
    if coord.halted():
        raise CoordinatorError(ErrorKind.Halted, f"run is {coord.run_state.name}")
    height = coord.current_round().height
    if height < 2:
        raise CoordinatorError(
            ErrorKind.InvalidHealthCheck, f"round height {height} < 2: pipeline not full yet"
        )
    _check_entitled_to_accuse(coord, from_id)
    for client_id, proof in checks:
        if healthy(coord, client_id, proof):
            record_false_report(coord, from_id)
            raise CoordinatorError(
                ErrorKind.InvalidHealthCheck,
                f"{short_id(from_id)} accused healthy client {short_id(client_id)}",
            )
    dropped = 0
    clients = coord.epoch_state.clients
    for _, proof in checks:
        # healthy() checked that clients[proof.index] exists and is the accused client.
        client = clients[proof.index]
        if client.state == ClientState.Healthy:
            client.state = ClientState.Dropped
            dropped += 1
    return dropped
