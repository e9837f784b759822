"""The pure coordinator state machine of a run (reference sections 1, 4.2, 5 and 6).

`Coordinator` holds the whole state and takes every input as a method call with the clock
(`now`, integer unix seconds) and randomness (`seed`, u64) as arguments; it never does I/O and
loads no cryptography (an equivocation proof's signatures are checked by the verifier the
caller passes in). The package reads bottom-up; a module imports only those above it here:

- `errors`, `quorum`, `health`: error kinds, the witness quorum, a trainer's health score;
- `committee`: committee and witness selection of a round, with their proofs;
- `types`: the state's value types; `verdicts`: verification reports and convictions;
- `state`: `CoordinatorState`, the fields and the helpers every rule uses;
- the rules, each taking the state: `assignment` (batch sizes and a round's data),
  `verification` (who verifies what), `checkpoints`, `misconduct` (false reports counted),
  `plausibility` (the most bits an honest witness bloom can set), `accusations`
  (verification reports judged), `equivocation` (proofs that a trainer signed two results
  for one batch), `transitions` (tick, pause, resume), `witnesses` (witnesses and health
  checks), `wire` (msgpack and state.toml forms), `resume` (what a restarted server resumes
  from);
- `machine`: `Coordinator`, the state with every input as a method.
"""

from psyche_common.client_id import short_id
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.health import health_score
from psyche_common.coordinator.machine import Coordinator
from psyche_common.coordinator.quorum import witness_quorum
from psyche_common.coordinator.state import CoordinatorInvariantError, CoordinatorState
from psyche_common.coordinator.types import (
    ACTIVE_STATES,
    HALTED_STATES,
    MAX_CLIENTS,
    MAX_WITNESSES,
    NUM_STORED_ROUNDS,
    Client,
    ClientState,
    EpochState,
    Progress,
    Round,
    RunState,
    TickResult,
    Witness,
)
from psyche_common.coordinator.verdicts import (
    Accusation,
    Attestation,
    Conviction,
    ConvictionKind,
    VerificationRecord,
)

__all__ = [
    "ACTIVE_STATES",
    "HALTED_STATES",
    "MAX_CLIENTS",
    "MAX_WITNESSES",
    "NUM_STORED_ROUNDS",
    "Accusation",
    "Attestation",
    "Client",
    "ClientState",
    "Conviction",
    "ConvictionKind",
    "Coordinator",
    "CoordinatorError",
    "CoordinatorInvariantError",
    "CoordinatorState",
    "EpochState",
    "ErrorKind",
    "Progress",
    "Round",
    "RunState",
    "TickResult",
    "VerificationRecord",
    "Witness",
    "health_score",
    "short_id",
    "witness_quorum",
]
