"""The pure coordinator state machine of a run (reference sections 1, 4.2, 5 and 6).

`Coordinator` holds the whole state and takes every input as a method call with the clock
(`now`, integer unix seconds) and randomness (`seed`, u64) as arguments; it never does I/O.
Modules: `types` (value types), `errors`, `quorum`, `committee` (committee and witness
selection), `assignment` (batch sizes and a round's data assignment), `verification` (who
verifies what), `state` (the dataclass and helpers), `transitions` (tick, pause, resume),
`witnesses` (witnesses and health checks), `health` (a trainer's health score),
`plausibility` (the most bits an honest witness bloom can have set), `equivocation` (proofs
that a trainer signed two results for one batch), `checkpoints`, `wire`
(msgpack and state.toml forms), `resume` (what a restarted server resumes from).
"""

from psyche_common.client_id import short_id
from psyche_common.coordinator.errors import CoordinatorError, ErrorKind
from psyche_common.coordinator.health import health_score
from psyche_common.coordinator.quorum import witness_quorum
from psyche_common.coordinator.state import Coordinator, CoordinatorInvariantError
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
