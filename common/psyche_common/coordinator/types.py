"""Value types of the coordinator's state (reference sections 1.1, 1.2 and 5.1).

`ClientState`, `Client`, `Witness`, `Round`, `Progress`, `EpochState`, `TickResult`, the
capacity constants and the halted and active sets of `RunState` (which `psyche_common.run_state`
defines and this module re-exports). Each type converts itself to and from a msgpack-safe form
(`to_wire` / `from_wire`); `from_wire` raises ValueError naming the bad field.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

from psyche_common.bloom import WITNESS_BLOOM_KEYS, Bloom
from psyche_common.client_id import CLIENT_ID_LEN, short_id
from psyche_common.coordinator.committee import WitnessProof
from psyche_common.run_state import RunState as RunState  # re-exported
from psyche_common.wire_checks import wire_list, wire_map, wire_uint

MAX_CLIENTS = 256
MAX_WITNESSES = 32
NUM_STORED_ROUNDS = 4
MERKLE_ROOT_LEN = 32
U32_MAX = 0xFFFF_FFFF

HALTED_STATES = frozenset({RunState.Uninitialized, RunState.Finished, RunState.Paused})
ACTIVE_STATES = frozenset({RunState.RoundTrain, RunState.RoundWitness, RunState.Cooldown})


class ClientState(enum.IntEnum):
    """An epoch member's standing: healthy, or how it left the epoch."""

    Healthy = 0
    Dropped = 1
    Withdrawn = 2
    Ejected = 3

    def __str__(self) -> str:
        return self.name


def check_client_id(value: Any, what: str) -> bytes:
    if not isinstance(value, bytes | bytearray) or len(value) != CLIENT_ID_LEN:
        raise ValueError(f"{what} must be {CLIENT_ID_LEN} bytes, got {value!r:.80}")
    return bytes(value)


@dataclass(eq=False)
class Client:
    """A member of the epoch. Equality and hash use only `id` (as in the reference).

    `rate` is its witnessed throughput, smoothed over rounds, and `misses` the rounds in a row
    whose result no witness quorum saw (`shares`; both 0 without per-client shares). The wire
    form carries them only when one is set, so runs without shares keep the reference's
    three-element form."""

    id: bytes
    state: ClientState = ClientState.Healthy
    exited_height: int = 0
    rate: int = 0
    misses: int = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Client) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __str__(self) -> str:
        return short_id(self.id)

    def to_wire(self) -> list[Any]:
        head = [self.id, int(self.state), self.exited_height]
        return [*head, self.rate, self.misses] if self.rate or self.misses else head

    @classmethod
    def from_wire(cls, data: Any) -> Client:
        if not isinstance(data, list | tuple) or len(data) not in (3, 5):
            raise ValueError(
                f"client must be [id, state, exited_height(, rate, misses)], got {data!r:.80}"
            )
        client_id, state, exited_height = data[:3]
        rate, misses = data[3:] if len(data) == 5 else (0, 0)
        if state not in ClientState._value2member_map_:
            raise ValueError(f"client state {state!r} is unknown")
        if not isinstance(exited_height, int) or exited_height < 0:
            raise ValueError(f"client exited_height {exited_height!r} is not a height")
        if not isinstance(rate, int) or isinstance(rate, bool) or not 0 <= rate < 1 << 64:
            raise ValueError(f"client rate {rate!r} is not a u64")
        if not isinstance(misses, int) or isinstance(misses, bool) or not 0 <= misses <= 0xFF:
            raise ValueError(f"client misses {misses!r} is not a u8")
        client = cls(check_client_id(client_id, "client id"), ClientState(state), exited_height)
        client.rate, client.misses = rate, misses
        return client


@dataclass
class Witness:
    """One witness's report: its proof, two blooms and the Merkle root of the broadcasts.

    With per-client shares on, `result_ms` times the attested round's results: one entry per
    batch of that round in sample order, the milliseconds from when the witness learned the
    round's batches to the first verified result of the batch (0: none arrived). Left out of
    the wire form when empty."""

    proof: WitnessProof
    participant_bloom: Bloom = field(default_factory=Bloom)
    broadcast_bloom: Bloom = field(default_factory=Bloom)
    broadcast_merkle: bytes = bytes(MERKLE_ROOT_LEN)
    result_ms: list[int] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "proof": self.proof.to_wire(),
            "participant_bloom": self.participant_bloom.to_wire(),
            "broadcast_bloom": self.broadcast_bloom.to_wire(),
            "broadcast_merkle": self.broadcast_merkle,
        }
        if self.result_ms:
            wire["result_ms"] = list(self.result_ms)
        return wire

    @classmethod
    def from_wire(cls, data: Any) -> Witness:
        data = wire_map(data, "witness")
        merkle = data.get("broadcast_merkle")
        if not isinstance(merkle, bytes | bytearray) or len(merkle) != MERKLE_ROOT_LEN:
            raise ValueError(f"witness.broadcast_merkle must be {MERKLE_ROOT_LEN} bytes")
        try:
            proof = WitnessProof.from_wire(data.get("proof"))
            blooms = {
                name: Bloom.from_wire(data.get(name))
                for name in ("participant_bloom", "broadcast_bloom")
            }
        except ValueError as exc:
            raise ValueError(f"witness: {exc}") from exc
        for name, bloom in blooms.items():
            if len(bloom.keys) != WITNESS_BLOOM_KEYS:
                raise ValueError(f"witness.{name} must have {WITNESS_BLOOM_KEYS} keys")
        result_ms = data.get("result_ms", [])
        if not isinstance(result_ms, list | tuple) or len(result_ms) > MAX_CLIENTS:
            raise ValueError(f"witness.result_ms must be a list of at most {MAX_CLIENTS} times")
        for value in result_ms:
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U32_MAX:
                raise ValueError(f"witness.result_ms holds {value!r:.40}, not a u32")
        return cls(proof=proof, broadcast_merkle=bytes(merkle), result_ms=list(result_ms), **blooms)


@dataclass
class Round:
    """One slot of the 4-round ring buffer."""

    witnesses: list[Witness] = field(default_factory=list)
    data_index: int = 0
    random_seed: int = 0
    height: int = 0
    clients_len: int = 0
    tie_breaker_tasks: int = 0
    next_random_seed: int = 0
    """The seed of the round after this one, drawn when this one starts."""
    seated: int = 0
    """Clients seated mid-epoch at this round's start (`joining`), appended after the
    `clients_len - seated` clients of the round before: the previous round's clients are
    then a prefix of this one's. Left out of the wire form when 0."""
    shares: list[int] = field(default_factory=list)
    """Per-client shares: the samples of each trainer of the round, in the round's trainer
    order (`assignment.trainer_ids`); empty: the batch is split equally. Left out of the wire
    form when empty."""
    sample_seed: bytes = field(default=b"", compare=False)
    """The seed of the verifiers' samples (`verification.verifier_sample`): fresh server
    randomness drawn when the round starts, kept out of the wire form until the round enters
    RoundWitness (`sample_revealed`), so no trainer knows before it publishes whether its
    batch will be checked. Empty in a client's copy until revealed."""
    sample_commit: bytes = b""
    """SHA-256 of `sample_seed` (`verification.sample_commitment`), broadcast from the round's
    start: the revealed seed must match it, so the server cannot pick it after the fact."""
    sample_revealed: bool = field(default=False, compare=False)
    """Whether `sample_seed` is out. This and `sample_seed` are left out of comparisons: a
    copy decoded from the wire form lacks the seed until it is revealed, and is the same
    public state."""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "witnesses": [w.to_wire() for w in self.witnesses],
            "data_index": self.data_index,
            "random_seed": self.random_seed,
            "next_random_seed": self.next_random_seed,
            "height": self.height,
            "clients_len": self.clients_len,
            "tie_breaker_tasks": self.tie_breaker_tasks,
        }
        if self.shares:
            wire["shares"] = list(self.shares)
        if self.seated:
            wire["seated"] = self.seated
        if self.sample_commit:
            wire["sample_commit"] = self.sample_commit
        if self.sample_revealed and self.sample_seed:
            wire["sample_seed"] = self.sample_seed
        return wire

    @classmethod
    def from_wire(cls, data: Any) -> Round:
        data = wire_map(data, "round")
        witnesses = [Witness.from_wire(w) for w in wire_list(data, "witnesses", "round")]
        if len(witnesses) > MAX_WITNESSES:
            raise ValueError(f"round has {len(witnesses)} witnesses (max {MAX_WITNESSES})")
        shares = data.get("shares", [])
        if not isinstance(shares, list | tuple) or len(shares) > MAX_CLIENTS:
            raise ValueError(f"round.shares must be a list of at most {MAX_CLIENTS} sizes")
        for size in shares:
            if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 0xFFFF:
                raise ValueError(f"round.shares holds {size!r:.40}, not a size from 1 to 65535")
        sample_commit = _optional_digest(data, "sample_commit")
        sample_seed = _optional_digest(data, "sample_seed")
        if sample_seed and sample_commitment(sample_seed) != sample_commit:
            raise ValueError("round.sample_seed does not match round.sample_commit")
        return cls(
            witnesses=witnesses,
            sample_seed=sample_seed,
            sample_commit=sample_commit,
            sample_revealed=bool(sample_seed),
            shares=list(shares),
            seated=_optional_uint(data, "seated", "round"),
            **{
                key: wire_uint(data, key, "round")
                for key in (
                    "data_index",
                    "random_seed",
                    "height",
                    "clients_len",
                    "tie_breaker_tasks",
                    "next_random_seed",
                )
            },
        )


SAMPLE_COMMIT_DOMAIN = b"psyche-py/verifier-sample-commit/v1\x00"
"""Domain of `Round.sample_commit` (SHA-256 over it and the round's `sample_seed`)."""


def sample_commitment(sample_seed: bytes) -> bytes:
    """What a round broadcasts of its hidden `sample_seed` before revealing it."""
    return hashlib.sha256(SAMPLE_COMMIT_DOMAIN + sample_seed).digest()


def _optional_uint(data: dict[str, Any], key: str, what: str) -> int:
    """`data[key]` as a non-negative integer, 0 when absent."""
    return wire_uint(data, key, what) if key in data else 0


def _optional_digest(data: dict[str, Any], key: str) -> bytes:
    value = data.get(key, b"")
    if not isinstance(value, bytes) or len(value) not in (0, 32):
        raise ValueError(f"round.{key} must be 32 bytes")
    return value


@dataclass
class Progress:
    """Counters that persist across epochs."""

    epoch: int = 0
    step: int = 1
    epoch_start_data_index: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "epoch_start_data_index": self.epoch_start_data_index,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Progress:
        data = wire_map(data, "progress")
        return cls(
            **{
                key: wire_uint(data, key, "progress")
                for key in ("epoch", "step", "epoch_start_data_index")
            }
        )


@dataclass
class Joiner:
    """A client joining mid-epoch, following the rounds from `since_height` (the first round
    start at which it held a model, since its admission); `ready` once its weights hash at the snapshot step matched the members' majority (the
    server checks it), then seated at the next round start."""

    id: bytes
    since_height: int
    ready: bool = False
    admitted_height: int = 0
    """The round it was admitted at (`since_height` moves on while it holds no model yet)."""

    def to_wire(self) -> list[Any]:
        return [self.id, self.since_height, self.ready, self.admitted_height]

    @classmethod
    def from_wire(cls, data: Any) -> Joiner:
        if not isinstance(data, list | tuple) or len(data) != 4:
            raise ValueError(
                "epoch_state.joining entries must be [id, since_height, ready, admitted_height]"
            )
        client_id, since, ready, admitted = data
        if not isinstance(client_id, bytes) or len(client_id) != 32:
            raise ValueError("epoch_state.joining id must be 32 bytes")
        for name, value in (("since_height", since), ("admitted_height", admitted)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 32:
                raise ValueError(f"epoch_state.joining {name} must be a u32")
        if not isinstance(ready, bool):
            raise ValueError("epoch_state.joining ready must be a bool")
        return cls(client_id, since, ready, admitted)


@dataclass
class EpochState:
    """Per-epoch state; replaced by a fresh one at every epoch start."""

    rounds: list[Round] = field(default_factory=lambda: [Round() for _ in range(NUM_STORED_ROUNDS)])
    clients: list[Client] = field(default_factory=list)
    exited_clients: list[Client] = field(default_factory=list)
    rounds_head: int = 0
    start_step: int = 0
    last_step: int = 0
    start_timestamp: int = 0
    first_round: bool = True
    cold_start_epoch: bool = False
    joining: list[Joiner] = field(default_factory=list)
    """Clients joining mid-epoch (`[config] join_mid_epoch`): not members yet (no committee,
    no batches), in admission order (`coordinator.joining`). Left out of the wire form when
    empty."""

    def to_wire(self) -> dict[str, Any]:
        wire = self._to_wire()
        if self.joining:
            wire["joining"] = [j.to_wire() for j in self.joining]
        return wire

    def _to_wire(self) -> dict[str, Any]:
        return {
            "rounds": [r.to_wire() for r in self.rounds],
            "clients": [c.to_wire() for c in self.clients],
            "exited_clients": [c.to_wire() for c in self.exited_clients],
            "rounds_head": self.rounds_head,
            "start_step": self.start_step,
            "last_step": self.last_step,
            "start_timestamp": self.start_timestamp,
            "first_round": self.first_round,
            "cold_start_epoch": self.cold_start_epoch,
        }

    @classmethod
    def from_wire(cls, data: Any) -> EpochState:
        data = wire_map(data, "epoch_state")
        rounds = [Round.from_wire(r) for r in wire_list(data, "rounds", "epoch_state")]
        if len(rounds) != NUM_STORED_ROUNDS:
            raise ValueError(f"epoch_state.rounds must hold {NUM_STORED_ROUNDS} rounds")
        clients = [Client.from_wire(c) for c in wire_list(data, "clients", "epoch_state")]
        exited = [Client.from_wire(c) for c in wire_list(data, "exited_clients", "epoch_state")]
        if len(clients) > MAX_CLIENTS or len(exited) > MAX_CLIENTS:
            raise ValueError(f"epoch_state holds more than {MAX_CLIENTS} clients")
        head = wire_uint(data, "rounds_head", "epoch_state")
        if head >= NUM_STORED_ROUNDS:
            raise ValueError(f"epoch_state.rounds_head {head} is out of range")
        flags = {}
        for key in ("first_round", "cold_start_epoch"):
            value = data.get(key)
            if not isinstance(value, bool):
                raise ValueError(f"epoch_state.{key} must be a bool")
            flags[key] = value
        joining = (
            [Joiner.from_wire(j) for j in wire_list(data, "joining", "epoch_state")]
            if "joining" in data
            else []
        )
        if len(joining) > MAX_CLIENTS or len(joining) + len(clients) > MAX_CLIENTS:
            raise ValueError(f"epoch_state holds more than {MAX_CLIENTS} clients and joiners")
        return cls(
            rounds=rounds,
            clients=clients,
            exited_clients=exited,
            joining=joining,
            rounds_head=head,
            start_step=wire_uint(data, "start_step", "epoch_state"),
            last_step=wire_uint(data, "last_step", "epoch_state"),
            start_timestamp=wire_uint(data, "start_timestamp", "epoch_state"),
            **flags,
        )


@dataclass(frozen=True)
class TickResult:
    """`Ticked` (epoch_ended False) or `EpochEnd(success)`."""

    epoch_ended: bool = False
    success: bool = False

    @classmethod
    def ticked(cls) -> TickResult:
        return cls(False, False)

    @classmethod
    def epoch_end(cls, success: bool) -> TickResult:
        return cls(True, success)

    def __str__(self) -> str:
        return f"EpochEnd({self.success})" if self.epoch_ended else "Ticked"
