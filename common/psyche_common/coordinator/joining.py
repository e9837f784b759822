"""Joining mid-epoch (`[config] join_mid_epoch`, ours): admitting joiners at a round start,
marking them in sync, seating them at a later round start (pure; no I/O).

The path of one joiner, by round height (docs/server.md, "Joining mid-epoch"):

- **h** (`admit`, at the start of a round): a pending client that is no member, was not
  removed from this epoch (dropped, ejected, convicted) and fits under `MAX_CLIENTS` becomes
  a `Joiner` (at most `MAX_ADMITTED_PER_ROUND` a round, in the server's seat order), so that
  members let it link to them. It has no committee and no batch. `since_height` h is the
  first round start at which it holds a loaded model (its `Join` says so: the round it was
  admitted at, or later, `follow`); from round h on it follows the rounds as an observer,
  collecting every result.
- **h + 1** (`snapshot_height`): after their apply at this round's start, the members share
  their weights (the step of round h + 1); the joiner fetches them, applies round h's
  results at round h + 2 like everyone, and reports its weights hash at the snapshot step.
  The server compares it with the members' majority for that step and calls `mark_ready`.
- **the next round start after that** (`seat`): a ready joiner is appended to the clients
  (so the earlier clients keep their indices, and the previous round's clients are a prefix
  of the new round's: `CoordinatorState.round_clients`) and trains from that round on; with
  per-client shares its first share is small (half the slowest member's rate), and grows as
  the witnesses time it.

A joiner that is not ready `JOIN_TIMEOUT_ROUNDS` rounds after its admission
(`admitted_height`), or that left
the pending set, is removed; it is admitted afresh at a later round while it stays pending
(a new `since_height`, a new snapshot).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import MAX_CLIENTS, Client, ClientState, Joiner

REMOVED_STATES = frozenset({ClientState.Dropped, ClientState.Ejected})

MAX_ADMITTED_PER_ROUND = 8
"""Joiners admitted at one round start: each admission makes every member export a snapshot
of its weights at the next round, so a crowd of arrivals is let in a few at a time."""

JOIN_TIMEOUT_ROUNDS = 8
"""Rounds after its admission within which a joiner must be ready, else it is removed (and may
be admitted again): time to fetch the model, prove it, and the round it is seated at."""


def snapshot_height(joiner: Joiner) -> int:
    """The round at whose start the members share the weights this joiner fetches."""
    return joiner.since_height + 1


def admit(
    coord: CoordinatorState,
    pending: Sequence[bytes],
    holders: Collection[bytes] | None,
    height: int,
) -> list[bytes]:
    """Admit pending clients to `joining` at the start of round `height` (see the module
    docstring); returns the ids admitted. `holders`: the pending clients that hold a loaded
    model (None: all), the others follow from the next round at the earliest."""
    es = coord.epoch_state
    # members, joiners, and clients a health check or the verifiers removed this epoch (they
    # wait for the next epoch, as without mid-epoch joins)
    present = (
        {client.id for client in es.clients}
        | {j.id for j in es.joining}
        | {c.id for c in es.exited_clients if c.state in REMOVED_STATES}
    )
    room = MAX_CLIENTS - len(es.clients) - len(es.joining)
    admitted: list[bytes] = []
    for client_id in pending:
        if len(admitted) >= min(room, MAX_ADMITTED_PER_ROUND):
            break
        if client_id in present:
            continue
        if coord.verification.banned(client_id, coord.progress.epoch):
            continue
        holds = holders is None or client_id in holders
        es.joining.append(Joiner(client_id, height if holds else height + 1, False, height))
        present.add(client_id)
        admitted.append(client_id)
    return admitted


def prune(coord: CoordinatorState, pending: Sequence[bytes], height: int) -> None:
    """Remove joiners that left the pending set, were banned, or are not ready
    `JOIN_TIMEOUT_ROUNDS` rounds after their admission (at the start of round `height`)."""
    es = coord.epoch_state
    still = set(pending)
    epoch = coord.progress.epoch
    es.joining = [
        j
        for j in es.joining
        if j.id in still
        and not coord.verification.banned(j.id, epoch)
        and (j.ready or height - j.admitted_height <= JOIN_TIMEOUT_ROUNDS)
    ]


def follow(coord: CoordinatorState, holders: Collection[bytes] | None, height: int) -> None:
    """A joiner that still holds no model at the start of round `height` cannot follow it:
    it follows the rounds from the next one at the earliest (`since_height`)."""
    if holders is None:
        return
    for j in coord.epoch_state.joining:
        if not j.ready and j.id not in holders:
            j.since_height = height + 1


def seat(coord: CoordinatorState) -> list[bytes]:
    """Append the ready joiners to the clients (in admission order, within `MAX_CLIENTS`);
    returns the ids seated. Called at a round start, before the round's fields are set."""
    es = coord.epoch_state
    known = [client.rate for client in es.clients if client.rate > 0]
    # per-client shares: a small first share (half the slowest member's rate), which the
    # witnesses' timings then raise to its speed; 0 (the mean) without known rates
    rate = min(known) // 2 if known else 0
    seated: list[bytes] = []
    waiting: list[Joiner] = []
    for joiner in es.joining:
        if joiner.ready and len(es.clients) < MAX_CLIENTS:
            es.clients.append(Client(joiner.id, rate=rate))
            seated.append(joiner.id)
        else:
            waiting.append(joiner)
    es.joining = waiting
    return seated


def joiner(coord: CoordinatorState, client_id: bytes) -> Joiner | None:
    return next((j for j in coord.epoch_state.joining if j.id == client_id), None)


def snapshot_step(coord: CoordinatorState, joiner: Joiner) -> int:
    """The coordinator step of the joiner's snapshot (the step of round
    `snapshot_height(joiner)`: one step per round within an epoch)."""
    height = coord.current_round().height
    return coord.progress.step + snapshot_height(joiner) - height


def mark_ready(coord: CoordinatorState, client_id: bytes) -> bool:
    """The server found the joiner's weights hash at its snapshot step equal to the members'
    majority: it is seated at the next round start. False when `client_id` is not joining."""
    found = joiner(coord, client_id)
    if found is None:
        return False
    found.ready = True
    return True


def round_start(
    coord: CoordinatorState,
    pending: Sequence[bytes] | None,
    holders: Collection[bytes] | None,
    height: int,
) -> int:
    """What a round start does with joiners when `join_mid_epoch` is on: prune, seat the ready
    ones, admit new ones (only in a round that trains: the flush rounds at an epoch's end
    admit nobody); returns how many were seated. `pending` None: admit and prune nothing."""
    if not coord.config.join_mid_epoch:
        return 0
    if pending is not None:
        prune(coord, pending, height)
    follow(coord, holders, height)
    seated = seat(coord)
    if pending is not None and coord.is_training_round():
        admit(coord, pending, holders, height)
    return len(seated)
