"""`[epoch_state]` of a saved state.toml: the pydantic model of its TOML form, validated like
the rest of the file (unknown keys are errors, every value checked), so a file that loads is
one the coordinator can resume from.

The TOML form writes bytes as lowercase hex and the full-range u64s (round seeds, bloom keys)
as decimal strings, because TOML integers are signed 64-bit; integers are accepted for them
too. `EpochStateTable.to_toml()` gives that form back (what
`psyche_common.coordinator.wire.epoch_state_from_toml` turns into the coordinator's
`EpochState`). The capacities are the coordinator's: 4 stored rounds, at most 32 witnesses a
round and 256 clients an epoch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PlainSerializer, PlainValidator
from pydantic_core import PydanticCustomError

from psyche_common.bloom import WITNESS_BLOOM_BITS, WITNESS_BLOOM_KEYS
from psyche_common.client_id import CLIENT_ID_LEN
from psyche_common.config._types import U32, U64, U64_MAX, Bool, StrictModel
from psyche_common.config.coordinator_rules import MAX_CLIENTS_PER_EPOCH, MAX_WITNESSES_PER_ROUND

NUM_STORED_ROUNDS = 4
"""The coordinator's ring of rounds (`psyche_common.coordinator.types.NUM_STORED_ROUNDS`)."""
MERKLE_ROOT_LEN = 32


def _u64_text(value: Any) -> int:
    """A u64 written as a decimal string (the saved form) or as an integer."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isdigit():
        number = int(value)
    if number is None or not 0 <= number <= U64_MAX:
        raise PydanticCustomError(
            "u64_text",
            'must be an integer from 0 to {max} (a decimal string such as "42"), not {value}',
            {"max": U64_MAX, "value": repr(value)[:40]},
        )
    return number


U64Text = Annotated[int, PlainValidator(_u64_text), PlainSerializer(str)]
"""A u64 saved as a decimal string."""


def _hex_bytes(size: int) -> PlainValidator:
    """Exactly `size` bytes, written as hex."""

    def parse(value: Any) -> bytes:
        data: bytes | None = None
        if isinstance(value, bytes):
            data = value
        elif isinstance(value, str):
            try:
                data = bytes.fromhex(value)
            except ValueError:
                data = None
        if data is None or len(data) != size:
            raise PydanticCustomError(
                "hex_bytes",
                "must be {size} bytes as {digits} hex characters, not {value}",
                {"size": size, "digits": 2 * size, "value": repr(value)[:80]},
            )
        return data

    return PlainValidator(parse)


_AS_HEX = PlainSerializer(bytes.hex)
ClientIdHex = Annotated[bytes, _hex_bytes(CLIENT_ID_LEN), _AS_HEX]
MerkleHex = Annotated[bytes, _hex_bytes(MERKLE_ROOT_LEN), _AS_HEX]
BloomBitsHex = Annotated[bytes, _hex_bytes(WITNESS_BLOOM_BITS // 8), _AS_HEX]


def _witness_flag(value: Any) -> bool:
    """A bool, or 0 / 1 (a u8 in the reference)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise PydanticCustomError("bool_type", "must be true or false (or 0 / 1)")


class BloomTable(StrictModel):
    """A witness bloom filter: its keys and its bits (little-endian, as hex)."""

    keys: Annotated[
        list[U64Text], Field(min_length=WITNESS_BLOOM_KEYS, max_length=WITNESS_BLOOM_KEYS)
    ]
    bits: BloomBitsHex


class WitnessProofTable(StrictModel):
    position: U64
    index: U64
    witness: Annotated[bool, PlainValidator(_witness_flag)]


class WitnessTable(StrictModel):
    """One witness's report of a round."""

    proof: WitnessProofTable
    participant_bloom: BloomTable
    broadcast_bloom: BloomTable
    broadcast_merkle: MerkleHex
    result_ms: Annotated[list[U32], Field(max_length=MAX_CLIENTS_PER_EPOCH)] | None = None
    """Per-client shares only: milliseconds to each batch's first verified result."""


class RoundTable(StrictModel):
    """One slot of the ring of rounds."""

    witnesses: Annotated[list[WitnessTable], Field(max_length=MAX_WITNESSES_PER_ROUND)] = Field(
        default_factory=list
    )
    data_index: U64
    random_seed: U64Text = 0
    next_random_seed: U64Text = 0
    """Absent in states saved before the next round's seed was kept: 0, like a fresh round."""
    height: U64
    clients_len: U64
    tie_breaker_tasks: U64
    shares: Annotated[list[U64], Field(max_length=MAX_CLIENTS_PER_EPOCH)] | None = None
    """Per-client shares only: each trainer's samples of the round."""
    seated: U64 | None = None
    """Mid-epoch joins only: the clients seated at the round's start."""
    sample_commit: MerkleHex | None = None
    """SHA-256 of the round's hidden verifier-sample seed (the seed itself is never saved);
    absent in states saved before the hidden sample."""


class ClientTable(StrictModel):
    """An epoch member: its key (hex), standing and the height it left at."""

    id: ClientIdHex
    state: Literal["Healthy", "Dropped", "Withdrawn", "Ejected"]
    exited_height: U64
    rate: U64Text | None = None
    """Per-client shares only: the smoothed throughput the shares are cut by."""
    misses: U64 | None = None
    """Per-client shares only: rounds in a row whose result no witness quorum saw."""


Clients = Annotated[list[ClientTable], Field(max_length=MAX_CLIENTS_PER_EPOCH)]


class EpochStateTable(StrictModel):
    """`[epoch_state]`: the epoch a saved coordinator was in."""

    rounds: Annotated[
        list[RoundTable], Field(min_length=NUM_STORED_ROUNDS, max_length=NUM_STORED_ROUNDS)
    ]
    clients: Clients = Field(default_factory=list)
    exited_clients: Clients = Field(default_factory=list)
    rounds_head: Annotated[int, Field(strict=True, ge=0, lt=NUM_STORED_ROUNDS)]
    start_step: U64
    last_step: U64
    start_timestamp: U64
    first_round: Bool
    cold_start_epoch: Bool

    def to_toml(self) -> dict[str, Any]:
        """The TOML table (bytes as hex, u64 seeds and keys as decimal strings)."""
        return self.model_dump(exclude_none=True)
