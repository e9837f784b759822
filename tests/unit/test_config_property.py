"""Property tests: any representable state file survives to_toml_dict -> TOML text -> load, and
configs built to satisfy the reference rules pass them."""

from __future__ import annotations

import tomllib
from typing import Any

import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st
from psyche_common.bloom import WITNESS_BLOOM_BITS, WITNESS_BLOOM_KEYS
from psyche_common.client_id import CLIENT_ID_LEN
from psyche_common.config import (
    AdamWOptimizer,
    Architecture,
    BuiltinData,
    ConstantLR,
    CoordinatorConfig,
    CosineLR,
    DataType,
    DistroOptimizer,
    DontShuffle,
    DummyCheckpoint,
    DummyData,
    DummyOptimizer,
    EphemeralCheckpoint,
    Gcp,
    GcsCheckpoint,
    HttpData,
    HubCheckpoint,
    LinearLR,
    LLMConfig,
    LocalData,
    NumberedFiles,
    P2PCheckpoint,
    P2PGcsCheckpoint,
    PreprocessedData,
    SeededShuffle,
    ServerData,
    SingleUrl,
    StateFile,
    StateFileProgress,
    TokenSize,
    WarmupStableDecayLR,
    WeightedHttpData,
    coordinator_config_problem,
    parse_state,
)
from psyche_common.config.epoch_state import (
    MERKLE_ROOT_LEN,
    NUM_STORED_ROUNDS,
    BloomTable,
    ClientTable,
    EpochStateTable,
    RoundTable,
    WitnessProofTable,
    WitnessTable,
)
from psyche_common.coordinator import RunState


def uint(bits: int) -> st.SearchStrategy[int]:
    return st.integers(min_value=0, max_value=2**bits - 1)


def text(max_bytes: int) -> st.SearchStrategy[str]:
    return st.text(max_size=max_bytes).filter(lambda s: len(s.encode("utf-8")) <= max_bytes)


floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
seeds = st.tuples(*[uint(8)] * 32)

hub_fields = {"repo_id": text(64), "revision": st.none() | text(64)}
gcs_fields = {"bucket": text(64), "prefix": st.none() | text(64)}
checkpoints = st.one_of(
    st.just(EphemeralCheckpoint()),
    st.builds(DummyCheckpoint, **hub_fields),
    st.builds(HubCheckpoint, **hub_fields),
    st.builds(P2PCheckpoint, **hub_fields),
    st.builds(GcsCheckpoint, **gcs_fields),
    st.builds(P2PGcsCheckpoint, **gcs_fields),
)
http_locations = st.one_of(
    st.builds(SingleUrl, url=text(192)),
    st.builds(
        NumberedFiles,
        url_template=text(64),
        start_index=uint(32),
        n_left_pad_zeros=uint(8),
        num_files=uint(32),
    ),
    st.builds(Gcp, bucket_name=text(64), filter_directory=text(192)),
)
shuffles = st.one_of(st.just(DontShuffle()), st.builds(SeededShuffle, seed=seeds))
data_locations = st.one_of(
    st.just(DummyData()),
    st.builds(ServerData, address=text(64)),
    st.builds(LocalData, path=text(192)),
    st.builds(
        HttpData,
        location=http_locations,
        token_size_in_bytes=st.sampled_from(TokenSize),
        shuffle=shuffles,
    ),
    st.builds(WeightedHttpData, url=text(192)),
    st.builds(PreprocessedData, url=text(192)),
    st.builds(BuiltinData, name=text(64)),
)
warmup = {"base_lr": floats, "warmup_steps": uint(32), "warmup_init_lr": floats}
lr_schedules = st.one_of(
    st.builds(ConstantLR, **warmup),
    st.builds(LinearLR, **warmup, total_steps=uint(32), final_lr=floats),
    st.builds(CosineLR, **warmup, total_steps=uint(32), final_lr=floats),
    st.builds(
        WarmupStableDecayLR,
        **warmup,
        stable_steps=uint(32),
        cosine_decay_steps=uint(32),
        cosine_decay_final_lr=floats,
        linear_decay_steps=uint(32),
        linear_decay_final_lr=floats,
    ),
)
optional_float = st.none() | floats
optimizers = st.one_of(
    st.just(DummyOptimizer()),
    st.builds(
        AdamWOptimizer,
        betas=st.tuples(floats, floats),
        weight_decay=floats,
        eps=floats,
        clip_grad_norm=optional_float,
    ),
    st.builds(
        DistroOptimizer,
        clip_grad_norm=optional_float,
        weight_decay=optional_float,
        compression_decay=floats,
        compression_topk=uint(16),
        compression_chunk=uint(16),
        quantize_1bit=st.booleans(),
    ),
)
models = st.builds(
    LLMConfig,
    max_seq_len=uint(32),
    cold_start_warmup_steps=uint(32),
    architecture=st.sampled_from(Architecture),
    checkpoint=checkpoints,
    data_type=st.sampled_from(DataType),
    data_location=data_locations,
    lr_schedule=lr_schedules,
    optimizer=optimizers,
)
any_configs = st.builds(
    CoordinatorConfig,
    warmup_time=uint(64),
    cooldown_time=uint(64),
    max_round_train_time=uint(64),
    round_witness_time=uint(64) | st.integers(0, 10**12).map(lambda ms: ms / 1000),
    global_batch_size_warmup_tokens=uint(64),
    epoch_time=uint(64),
    total_steps=uint(32),
    init_min_clients=uint(16),
    min_clients=uint(16),
    witness_nodes=uint(16),
    global_batch_size_start=uint(16),
    global_batch_size_end=uint(16),
    verification_percent=uint(8),
    waiting_for_members_extra_time=uint(8),
)


def exact_bytes(size: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=size, max_size=size)


blooms = st.builds(
    BloomTable,
    keys=st.lists(uint(64), min_size=WITNESS_BLOOM_KEYS, max_size=WITNESS_BLOOM_KEYS),
    bits=exact_bytes(WITNESS_BLOOM_BITS // 8),
)
witness_tables = st.builds(
    WitnessTable,
    proof=st.builds(WitnessProofTable, position=uint(64), index=uint(64), witness=st.booleans()),
    participant_bloom=blooms,
    broadcast_bloom=blooms,
    broadcast_merkle=exact_bytes(MERKLE_ROOT_LEN),
    result_ms=st.none() | st.lists(uint(32), max_size=3),
)
round_tables = st.builds(
    RoundTable,
    witnesses=st.lists(witness_tables, max_size=2),
    data_index=uint(63),
    random_seed=uint(64),
    next_random_seed=uint(64),
    height=uint(63),
    clients_len=uint(63),
    tie_breaker_tasks=uint(63),
    shares=st.none() | st.lists(uint(63), max_size=3),
    sample_commit=st.none() | exact_bytes(MERKLE_ROOT_LEN),
)
client_tables = st.builds(
    ClientTable,
    id=exact_bytes(CLIENT_ID_LEN),
    state=st.sampled_from(["Healthy", "Dropped", "Withdrawn", "Ejected"]),
    exited_height=uint(63),
    rate=st.none() | uint(64),
    misses=st.none() | uint(63),
)
epoch_states = st.none() | st.builds(
    EpochStateTable,
    rounds=st.lists(round_tables, min_size=NUM_STORED_ROUNDS, max_size=NUM_STORED_ROUNDS),
    clients=st.lists(client_tables, max_size=3),
    exited_clients=st.lists(client_tables, max_size=2),
    rounds_head=st.integers(0, NUM_STORED_ROUNDS - 1),
    start_step=uint(63),
    last_step=uint(63),
    start_timestamp=uint(63),
    first_round=st.booleans(),
    cold_start_epoch=st.booleans(),
)
states = st.builds(
    StateFile,
    run_id=text(32),
    run_state=st.sampled_from(RunState),
    model=models,
    config=any_configs,
    progress=st.builds(
        StateFileProgress, epoch=uint(16), step=uint(32), epoch_start_data_index=uint(64)
    ),
    epoch_state=epoch_states,
    run_state_start_unix_timestamp=uint(64),
    pending_pause=st.booleans(),
)


def through_toml(document: dict[str, Any]) -> dict[str, Any]:
    return tomllib.loads(tomli_w.dumps(document))


@settings(max_examples=150, deadline=None)
@given(states)
def test_any_state_round_trips_through_toml(state: StateFile) -> None:
    assert parse_state(through_toml(state.to_toml_dict())) == state


@st.composite
def rule_abiding_configs(draw: st.DrawFn) -> CoordinatorConfig:
    epoch_time = draw(st.integers(2, 2**64 - 1))
    min_clients = draw(st.integers(1, 256))
    start = draw(st.integers(1, 2**16 - 1))
    return CoordinatorConfig(
        warmup_time=draw(st.integers(0, epoch_time - 1)),
        cooldown_time=draw(st.integers(1, 2**64 - 1)),
        max_round_train_time=draw(st.integers(1, epoch_time - 1)),
        round_witness_time=draw(
            st.integers(1, 2**64 - 1) | st.integers(1, 10**12).map(lambda ms: ms / 1000)
        ),
        global_batch_size_warmup_tokens=draw(uint(64)),
        epoch_time=epoch_time,
        total_steps=draw(st.integers(1, 2**32 - 1)),
        init_min_clients=draw(st.integers(min_clients, 256)),
        min_clients=min_clients,
        witness_nodes=draw(st.integers(0, min(min_clients, 32))),
        global_batch_size_start=start,
        global_batch_size_end=draw(st.integers(start, 2**16 - 1)),
        verification_percent=draw(uint(8)),
        waiting_for_members_extra_time=draw(st.integers(1, 255)),
    )


@settings(max_examples=200, deadline=None)
@given(rule_abiding_configs())
def test_rule_abiding_configs_pass(cfg: CoordinatorConfig) -> None:
    assert coordinator_config_problem(cfg) is None
    assert CoordinatorConfig.model_validate(through_toml(cfg.to_toml())) == cfg
