"""The client's phase and the one table that says what each coordinator run state means to it.

A client is always in one `Phase`. Every coordinator state it receives is looked up in
`ACTIONS` with its phase: the pair names exactly one `Action`. A pair the protocol never
produces (a RoundTrain straight after our Cooldown, say) maps to `Action.DESYNC`: the runner
logs it and recovers by going back to warmup, never silently ignoring it. A client that is not
in the epoch's client list leaves the epoch whatever the state (`action_for`).
"""

from __future__ import annotations

from enum import Enum

from psyche_common.coordinator import RunState


class Phase(Enum):
    """Where this client is in the coordinator's cycle."""

    IDLE = "idle"  # no model yet
    WARMUP = "warmup"  # model loaded, waiting for an epoch's first round
    TRAINING = "training"  # in a RoundTrain: training, exchanging, witnessing
    WITNESS = "witness"  # in a RoundWitness: the next round is prepared early
    COOLDOWN = "cooldown"  # the epoch's Cooldown: sharing and saving the model


class Action(Enum):
    """What the runner does on a (phase, run state) pair."""

    WAIT = "wait"  # nothing to do: the pair is expected and needs no work
    LOAD_MODEL = "load model"
    START_ROUND = "start round"  # a RoundTrain (a no-op for the round already running)
    ENTER_WITNESS = "enter witness"  # training time is over: witness, prepare the next round
    UPDATE_WITNESS = "update witness"  # a change within RoundWitness: maybe prepare now
    START_COOLDOWN = "start cooldown"
    LEAVE_EPOCH = "leave epoch"  # the epoch ended or went on without us: back to warmup
    DESYNC = "desync"  # a pair the protocol never produces: log it, back to warmup


_OUT_OF_EPOCH = (RunState.WaitingForMembers, RunState.Warmup, RunState.Paused, RunState.Finished)


def _build_table() -> dict[tuple[Phase, RunState], Action]:
    table: dict[tuple[Phase, RunState], Action] = {}
    for state in RunState:
        table[Phase.IDLE, state] = Action.LOAD_MODEL if state == RunState.Warmup else Action.WAIT
        table[Phase.WARMUP, state] = Action.WAIT
        for phase in (Phase.TRAINING, Phase.WITNESS, Phase.COOLDOWN):
            table[phase, state] = Action.LEAVE_EPOCH if state in _OUT_OF_EPOCH else Action.DESYNC
    table[Phase.WARMUP, RunState.RoundTrain] = Action.START_ROUND
    table[Phase.TRAINING, RunState.RoundTrain] = Action.START_ROUND
    table[Phase.TRAINING, RunState.RoundWitness] = Action.ENTER_WITNESS
    table[Phase.TRAINING, RunState.Cooldown] = Action.START_COOLDOWN
    table[Phase.WITNESS, RunState.RoundTrain] = Action.START_ROUND
    table[Phase.WITNESS, RunState.RoundWitness] = Action.UPDATE_WITNESS
    table[Phase.WITNESS, RunState.Cooldown] = Action.START_COOLDOWN
    table[Phase.COOLDOWN, RunState.Cooldown] = Action.WAIT
    return table


ACTIONS: dict[tuple[Phase, RunState], Action] = _build_table()
"""(phase, run state) → action for a client that is a member of the epoch."""


_IN_ROUND = (RunState.RoundTrain, RunState.RoundWitness)


def action_for(
    phase: Phase,
    state: RunState,
    is_member: bool,
    *,
    is_joiner: bool = False,
    follows: bool = False,
    may_join: bool = False,
) -> Action:
    """The action for a coordinator state. A non-member only ever loads, waits or leaves,
    except mid-epoch joins: in a run that admits them (`may_join`) it loads its model while
    the epoch's rounds run, once it is joining (`is_joiner`) it loads it in any case, and
    from the round it follows the epoch from (`follows`) it acts as a member does, until the
    Cooldown, which it leaves (docs/client.md, "Joining mid-epoch")."""
    if is_member:
        return ACTIONS[phase, state]
    if is_joiner and state in _IN_ROUND:
        if phase == Phase.IDLE:
            return Action.LOAD_MODEL
        return ACTIONS[phase, state] if follows else Action.WAIT
    if may_join and phase == Phase.IDLE and state in _IN_ROUND:
        return Action.LOAD_MODEL
    return Action.WAIT if phase in (Phase.IDLE, Phase.WARMUP) else Action.LEAVE_EPOCH
