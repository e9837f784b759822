"""Typed, validated client↔server messages of the coordinator port (and the data-server port).

Every frame after the handshake is one msgpack map with a `"type"` key naming the message.
`parse_client_message` / `parse_server_message` validate a decoded frame (strict types, no
unknown fields) and raise `InvalidMessage` naming the type and field at fault. `to_wire` gives the
msgpack-ready dict. Nested coordinator structures (witnesses, committee proofs, checkpoints, the
coordinator itself) travel as the coordinator module's own wire dicts and are converted there.
docs/protocol.md documents every field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from .authorization import MAX_AUTHORIZATION_BYTES
from .framing import ProtocolError

PROTOCOL_VERSION = 1
MAX_RUN_ID_LENGTH = 32
MAX_HEALTH_CHECKS = 1024
MAX_EVALS = 8
"""Eval scores one witness report carries (the reference's limit)."""
MAX_EVAL_NAME_LENGTH = 32

Bytes32 = Annotated[bytes, Field(strict=True, min_length=32, max_length=32)]
WireDict = dict[str, Any]
NonNegInt = Annotated[int, Field(strict=True, ge=0, lt=2**64)]
HostPort = Annotated[
    str, StringConstraints(strict=True, max_length=262, pattern=r"^\[?[A-Za-z0-9.:_-]+\]?:\d{1,5}$")
]


EvalName = Annotated[
    str, StringConstraints(strict=True, min_length=1, max_length=MAX_EVAL_NAME_LENGTH)
]
EvalScore = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class InvalidMessage(ProtocolError):
    """A decoded frame is not a valid message (unknown type, missing/extra/mistyped field)."""


class _Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


# ---------------------------------------------------------------- client → server


class Join(_Message):
    """Ask to take part in `run_id`; `p2p_address` is where other clients reach this one;
    `authorization`: a signed delegation (`protocol.authorization`) for a permissioned run,
    left out of the wire form when None (servers without the field still read the Join);
    `holds_model`: whether this process holds the run's weights (False for a client that
    started, or restarted, and has not loaded them yet; it joins again once it has)."""

    type: Literal["Join"] = "Join"
    run_id: Annotated[
        str, StringConstraints(strict=True, min_length=1, max_length=MAX_RUN_ID_LENGTH)
    ]
    p2p_address: HostPort
    client_version: Annotated[str, StringConstraints(strict=True, max_length=64)] = ""
    authorization: (
        Annotated[bytes, Field(strict=True, max_length=MAX_AUTHORIZATION_BYTES)] | None
    ) = None
    holds_model: Annotated[bool, Field(strict=True)] = True


class WitnessMetadata(_Message):
    """What a witness reports about its own training (the server logs and checks it)."""

    step: NonNegInt
    loss: float | None = None
    tokens_per_sec: float = 0.0
    bandwidth_per_sec: float = 0.0
    efficiency: float = 0.0
    weights_hash: Bytes32 | None = None
    evals: Annotated[dict[EvalName, EvalScore], Field(max_length=MAX_EVALS)] = {}
    """The client's latest eval scores (task or metric name → value), left out of the wire
    form when empty (servers without the field still read the report)."""


class Witness(_Message):
    """A round witness (`coordinator.witness`): blooms + proof as the coordinator's wire dict."""

    type: Literal["Witness"] = "Witness"
    witness: WireDict
    metadata: WitnessMetadata


class WarmupWitness(_Message):
    """A warmup witness (`coordinator.warmup_witness`)."""

    type: Literal["WarmupWitness"] = "WarmupWitness"
    witness: WireDict


class HealthCheckEntry(_Message):
    """An accusation: client `id` (32-byte key) with its committee `proof` wire dict."""

    id: Bytes32
    proof: WireDict


class HealthCheck(_Message):
    """Health accusations (may be empty) plus this client's own weights hash at `step`.

    An empty `checks` list is a pure status report: it never reaches the coordinator."""

    type: Literal["HealthCheck"] = "HealthCheck"
    checks: Annotated[list[HealthCheckEntry], Field(max_length=MAX_HEALTH_CHECKS)] = []
    step: NonNegInt | None = None
    weights_hash: Bytes32 | None = None


class Checkpoint(_Message):
    """A checkpoint the client uploaded (`coordinator.checkpoint`), as a wire dict."""

    type: Literal["Checkpoint"] = "Checkpoint"
    checkpoint: WireDict


class Accusation(_Message):
    """A verifier's report (`coordinator.accuse`): the result of `trainer` for `batch` at
    `step` disagrees with the verifier's recomputed gradient (`agreement_milli`: the measured
    sign agreement in thousandths); `commitment`: the data hash of the result it scored
    (optional for older clients; without it no attestation can refute the accusation)."""

    type: Literal["Accusation"] = "Accusation"
    step: NonNegInt
    trainer: Bytes32
    batch: Annotated[list[NonNegInt], Field(min_length=2, max_length=2)]
    agreement_milli: Annotated[int, Field(strict=True, ge=0, le=1000)]
    commitment: Bytes32 | None = None


class Attestation(_Message):
    """A verifier's report (`coordinator.attest`) that the result `commitment` of `trainer`
    for `batch` at `step` agrees with its recomputed gradient: it refutes accusations of that
    very result."""

    type: Literal["Attestation"] = "Attestation"
    step: NonNegInt
    trainer: Bytes32
    batch: Annotated[list[NonNegInt], Field(min_length=2, max_length=2)]
    agreement_milli: Annotated[int, Field(strict=True, ge=0, le=1000)]
    commitment: Bytes32


class Equivocation(_Message):
    """Proof that a trainer signed two different commitments for one batch of one step
    (`coordinator.equivocation`): `first` and `second` are `ResultCommitment` wire dicts
    (`psyche_common.announcements`), checked by the coordinator with both signatures."""

    type: Literal["Equivocation"] = "Equivocation"
    first: WireDict
    second: WireDict


AnyClientMessage = (
    Join
    | Witness
    | WarmupWitness
    | HealthCheck
    | Checkpoint
    | Accusation
    | Attestation
    | Equivocation
)
"""Plain union of the client → server messages, for type hints."""

ClientMessage = Annotated[AnyClientMessage, Field(discriminator="type")]

# ---------------------------------------------------------------- server → client


class CoordinatorState(_Message):
    """The full coordinator (`Coordinator.to_wire()`), the P2P address of every member,
    which of them accept no P2P connections (`unreachable`: served over links they open) and,
    in a permissioned run, the authorizer of each member admitted by delegation
    (`authorizers`: majorities count one vote per listed key with its delegates,
    `psyche_common.votes`)."""

    type: Literal["CoordinatorState"] = "CoordinatorState"
    coordinator: WireDict
    peers: dict[Bytes32, HostPort] = {}
    unreachable: Annotated[list[Bytes32], Field(max_length=65536)] = []
    authorizers: Annotated[dict[Bytes32, Bytes32], Field(max_length=65536)] = {}


class Rejected(_Message):
    """The server refuses this connection or request; it closes the stream afterwards."""

    type: Literal["Rejected"] = "Rejected"
    reason: str


_ALREADY_CONNECTED = " is already connected"


def already_connected_reason(client_short_id: str) -> str:
    """The `Rejected` reason for a second connection of an identity that is connected."""
    return f"identity {client_short_id}{_ALREADY_CONNECTED}"


def is_already_connected(reason: str) -> bool:
    """Whether a `Rejected` reason is `already_connected_reason`: the only rejection worth
    retrying (the server may still hold a dead connection of ours it has not noticed yet)."""
    return reason.startswith("identity ") and reason.endswith(_ALREADY_CONNECTED)


class WeightsMismatch(_Message):
    """This client's reported weights hash at `step` differs from the majority's
    (`majority_hash`): it must resync before it trains or witnesses again."""

    type: Literal["WeightsMismatch"] = "WeightsMismatch"
    step: NonNegInt
    majority_hash: Bytes32


class Reachability(_Message):
    """What the server found when it connected back to this client's advertised P2P address
    (`p2p_address`) after its Join: whether a P2P listener answered there (`reachable`, with a
    `detail`), the address the server sees this client's connection come from, and where its
    relay listens, if it has one (`psyche_common.protocol.relay_messages`)."""

    type: Literal["Reachability"] = "Reachability"
    p2p_address: HostPort
    reachable: bool
    observed_host: Annotated[str, StringConstraints(strict=True, max_length=255)]
    detail: Annotated[str, StringConstraints(strict=True, max_length=1024)] = ""
    relay_port: Annotated[int, Field(strict=True, ge=1, le=65535)] | None = None
    """The server's relay port (same host as the coordinator), or None: it relays nothing."""


AnyServerMessage = CoordinatorState | Rejected | WeightsMismatch | Reachability
"""Plain union of the server → client messages, for type hints."""

ServerMessage = Annotated[AnyServerMessage, Field(discriminator="type")]

CLIENT_MESSAGE_TYPES = frozenset(
    {
        "Join",
        "Witness",
        "WarmupWitness",
        "HealthCheck",
        "Checkpoint",
        "Accusation",
        "Equivocation",
        "Attestation",
    }
)
SERVER_MESSAGE_TYPES = frozenset(
    {"CoordinatorState", "Rejected", "WeightsMismatch", "Reachability"}
)

_client_adapter: TypeAdapter[AnyClientMessage] = TypeAdapter(ClientMessage)
_server_adapter: TypeAdapter[AnyServerMessage] = TypeAdapter(ServerMessage)

MessageT = TypeVar("MessageT")


def describe_validation_error(kind: str, exc: ValidationError) -> str:
    """`Join.p2p_address: String should match pattern ...; ...` (the first three problems)."""
    problems = []
    for err in exc.errors()[:3]:
        location = ".".join(str(part) for part in err["loc"][1:] if not isinstance(part, int))
        location = location or "(message)"
        problems.append(f"{kind}.{location}: {err['msg']}")
    more = len(exc.errors()) - len(problems)
    return "; ".join(problems) + (f" (+{more} more)" if more > 0 else "")


def _parse(adapter: TypeAdapter[MessageT], known: frozenset[str], obj: object) -> MessageT:
    if not isinstance(obj, dict):
        raise InvalidMessage(f"a message must be a map, got {type(obj).__name__}")
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in known:
        raise InvalidMessage(f"unknown message type {kind!r} (expected one of {sorted(known)})")
    try:
        return adapter.validate_python(obj)
    except ValidationError as exc:
        raise InvalidMessage(describe_validation_error(kind, exc)) from exc


def parse_client_message(obj: object) -> AnyClientMessage:
    """Validate a decoded client→server frame; raises `InvalidMessage`."""
    return _parse(_client_adapter, CLIENT_MESSAGE_TYPES, obj)


def parse_server_message(obj: object) -> AnyServerMessage:
    """Validate a decoded server→client frame; raises `InvalidMessage`."""
    return _parse(_server_adapter, SERVER_MESSAGE_TYPES, obj)


def to_wire(message: BaseModel) -> dict[str, Any]:
    """The msgpack-ready dict of a message (bytes stay bytes; a Join without an
    authorization and a witness report without eval scores leave the field out)."""
    wire = message.model_dump(mode="python")
    if isinstance(message, Join) and message.authorization is None:
        del wire["authorization"]
    if isinstance(message, Witness) and not message.metadata.evals:
        del wire["metadata"]["evals"]
    return wire
