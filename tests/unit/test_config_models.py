"""Parsing of state.toml / data.toml into the config models, errors naming fields, round trips."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from psyche_common.config import (
    AdamWOptimizer,
    Architecture,
    ConfigError,
    CosineLR,
    DataServerConfig,
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
    LLMConfig,
    NumberedFiles,
    P2PCheckpoint,
    P2PGcsCheckpoint,
    SeededShuffle,
    ServerData,
    SingleUrl,
    StateFile,
    TokenSize,
    WarmupStableDecayLR,
    load_data_config,
    load_state,
    parse_data_config,
    parse_state,
)
from psyche_common.coordinator import RunState

REPO_ROOT = Path(__file__).resolve().parents[2]


def example_document() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "state.toml.example").read_text())


def parse_error(document: dict[str, Any], **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_state(document, **kwargs)
    return caught.value


def fields_of(error: ConfigError) -> list[str]:
    return [problem.field for problem in error.problems]


def roundtrip(state: StateFile) -> StateFile:
    return parse_state(tomllib.loads(tomli_w.dumps(state.to_toml_dict())))


# --- the reference's fixtures ---------------------------------------------------------------


def state_fixture_paths(configs: Path) -> list[Path]:
    return sorted(configs.glob("*/state.toml"))


def test_every_fixture_state_parses_and_round_trips(shared_fixtures: Path) -> None:
    paths = state_fixture_paths(shared_fixtures / "configs")
    assert len(paths) >= 6
    for path in paths:
        state = load_state(path)
        assert state.run_state is RunState.WaitingForMembers
        assert roundtrip(state) == state, path


def test_solana_layouts_need_a_run_id(shared_fixtures: Path) -> None:
    paths = sorted((shared_fixtures / "configs" / "solana-test").glob("*.toml"))
    assert paths
    for path in paths:
        with pytest.raises(ConfigError) as caught:
            load_state(path)
        assert fields_of(caught.value) == ["run_id"]
        assert "--run-id" in str(caught.value)
        state = load_state(path, run_id="solana")
        assert state.run_id == "solana"
        assert roundtrip(state) == state


def test_fixture_values_are_read_exactly(shared_fixtures: Path) -> None:
    configs = shared_fixtures / "configs"
    test_state = load_state(configs / "test" / "state.toml")
    assert test_state.run_id == "test"
    assert test_state.config.total_steps == 10
    assert test_state.model.max_seq_len == 512
    assert isinstance(test_state.model.checkpoint, DummyCheckpoint)
    assert test_state.model.checkpoint.repo_id == ""
    assert isinstance(test_state.model.data_location, DummyData)
    assert isinstance(test_state.model.optimizer, DummyOptimizer)
    assert isinstance(test_state.model.lr_schedule, CosineLR)
    assert test_state.progress.step == 1

    big = load_state(configs / "consilience" / "state.toml")
    assert big.model.architecture is Architecture.HF_DEEPSEEK
    assert big.config.global_batch_size_warmup_tokens == 549_755_813_888
    assert isinstance(big.model.lr_schedule, WarmupStableDecayLR)
    assert big.model.lr_schedule.stable_steps == 161_000
    optimizer = big.model.optimizer
    assert isinstance(optimizer, DistroOptimizer)
    assert optimizer.weight_decay == 0.1 and optimizer.quantize_1bit is True

    dev = load_state(configs / "consilience-match-llama2-20m-fineweb-pretrain-dev" / "state.toml")
    assert dev.model.data_location == ServerData(address="127.0.0.1:20001")
    assert dev.model.checkpoint == HubCheckpoint(repo_id="emozilla/llama2-20m-init")
    assert dev.model.optimizer.clip_grad_norm is None

    nano = load_state(configs / "solana-test" / "nano-config.toml", run_id="n")
    data = nano.model.data_location
    assert isinstance(data, HttpData) and isinstance(data.location, SingleUrl)
    assert data.token_size_in_bytes is TokenSize.TWO_BYTES
    assert isinstance(data.shuffle, DontShuffle)
    assert nano.model.checkpoint.revision == "cf48eac4944f6e954a3d9c9c30e8c865e64e7d03"
    gcs = load_state(configs / "solana-test" / "light-config-gcs.toml", run_id="g")
    assert gcs.model.checkpoint == GcsCheckpoint(bucket="llama220minit")
    assert isinstance(gcs.model.data_location.location, Gcp)


def test_fixture_data_configs_resolve_dir_against_their_folder(shared_fixtures: Path) -> None:
    paths = sorted((shared_fixtures / "configs").glob("*/data.toml"))
    assert paths
    for path in paths:
        config = load_data_config(path)
        assert config.dir.is_absolute()
        assert config.dir.parent == (path.parent / "../../data").resolve()
        assert config.token_size is TokenSize.TWO_BYTES
        assert config.shuffle_seed_bytes == bytes(range(1, 33))


# --- TOML forms of the tagged enums ---------------------------------------------------------


def with_llm(**changes: Any) -> dict[str, Any]:
    document = example_document()
    document["model"]["LLM"].update(changes)
    return document


@pytest.mark.parametrize(
    ("toml_value", "expected"),
    [
        ("Ephemeral", EphemeralCheckpoint()),
        ({"Dummy": {"repo_id": ""}}, DummyCheckpoint(repo_id="")),
        (
            {"Hub": {"repo_id": "a/b", "revision": "main"}},
            HubCheckpoint(repo_id="a/b", revision="main"),
        ),
        ({"P2P": {"repo_id": "a/b"}}, P2PCheckpoint(repo_id="a/b")),
        ({"Gcs": {"bucket": "b", "prefix": "p"}}, GcsCheckpoint(bucket="b", prefix="p")),
        ({"P2PGcs": {"bucket": "b"}}, P2PGcsCheckpoint(bucket="b")),
    ],
)
def test_checkpoint_forms(toml_value: Any, expected: Any) -> None:
    state = parse_state(with_llm(checkpoint=toml_value))
    assert state.model.checkpoint == expected
    assert state.model.checkpoint.to_toml() == toml_value
    assert roundtrip(state) == state


@pytest.mark.parametrize(
    "toml_value",
    [
        "Dummy",
        {"Server": "127.0.0.1:20001"},
        {"Local": "/data/tokens"},
        {"WeightedHttp": "https://example.com/mix.json"},
        {"Preprocessed": "org/dataset"},
        {"Builtin": "python-stdlib"},
        {
            "Http": {
                "location": {"SingleUrl": "https://example.com/a.ds"},
                "token_size_in_bytes": "FourBytes",
                "shuffle": {"Seeded": list(range(32))},
            }
        },
        {
            "Http": {
                "location": {
                    "NumberedFiles": {
                        "url_template": "http://h/{}.ds",
                        "start_index": 3,
                        "n_left_pad_zeros": 2,
                        "num_files": 7,
                    }
                },
                "token_size_in_bytes": "TwoBytes",
                "shuffle": "DontShuffle",
            }
        },
        {
            "Http": {
                "location": {"Gcp": {"bucket_name": "b", "filter_directory": "d"}},
                "token_size_in_bytes": "TwoBytes",
                "shuffle": "DontShuffle",
            }
        },
    ],
)
def test_data_location_forms_round_trip(toml_value: Any) -> None:
    state = parse_state(with_llm(data_location=toml_value))
    assert state.model.data_location.to_toml() == toml_value
    assert roundtrip(state) == state


def test_http_location_objects() -> None:
    state = parse_state(
        with_llm(
            data_location={
                "Http": {
                    "location": {
                        "NumberedFiles": {
                            "url_template": "u{}",
                            "start_index": 0,
                            "n_left_pad_zeros": 3,
                            "num_files": 2,
                        }
                    },
                    "token_size_in_bytes": "FourBytes",
                    "shuffle": {"Seeded": [7] * 32},
                }
            }
        )
    )
    data = state.model.data_location
    assert isinstance(data, HttpData)
    assert isinstance(data.location, NumberedFiles) and data.location.num_files == 2
    assert isinstance(data.shuffle, SeededShuffle) and data.shuffle.seed_bytes == bytes([7] * 32)
    assert data.token_size_in_bytes.num_bytes == 4


def test_optimizer_forms() -> None:
    adamw = {"AdamW": {"betas": [0.9, 0.95], "weight_decay": 0.1, "eps": 1e-8}}
    state = parse_state(with_llm(optimizer=adamw))
    assert state.model.optimizer == AdamWOptimizer(betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    assert state.model.optimizer.to_toml() == adamw
    state = parse_state(with_llm(optimizer="Dummy"))
    assert isinstance(state.model.optimizer, DummyOptimizer)
    assert roundtrip(state) == state


def test_models_can_be_built_from_code() -> None:
    state = parse_state(example_document())
    model = LLMConfig(
        max_seq_len=64,
        cold_start_warmup_steps=0,
        architecture=Architecture.HF_LLAMA,
        checkpoint=HubCheckpoint(repo_id="builtin:llama-tiny"),
        data_type="Pretraining",
        data_location=DummyData(),
        lr_schedule=CosineLR(
            base_lr=1e-3, warmup_steps=1, warmup_init_lr=0.0, total_steps=10, final_lr=1e-4
        ),
        optimizer=DummyOptimizer(),
    )
    built = state.model_copy(update={"model": model})
    assert roundtrip(built) == built
    assert built.to_toml_dict()["model"]["LLM"]["checkpoint"] == {
        "Hub": {"repo_id": "builtin:llama-tiny"}
    }


def test_optional_state_fields_and_epoch_state_round_trip() -> None:
    document = example_document()
    document["progress"] = {"epoch": 2, "step": 57, "epoch_start_data_index": 440}
    document["run_state_start_unix_timestamp"] = 1_700_000_000
    document["pending_pause"] = 1
    saved = tomllib.loads((REPO_ROOT / "tests/unit/data/saved_state.toml").read_text())
    document["epoch_state"] = saved["epoch_state"]  # a real server's, mid-epoch
    state = parse_state(document)
    assert state.progress.step == 57 and state.pending_pause is True
    assert state.to_toml_dict()["epoch_state"] == saved["epoch_state"]
    assert roundtrip(state) == state


def test_defaults_when_optional_parts_are_absent() -> None:
    document = example_document()
    del document["run_state"]
    state = parse_state(document)
    assert state.run_state is RunState.WaitingForMembers
    assert (state.progress.epoch, state.progress.step, state.progress.epoch_start_data_index) == (
        0,
        1,
        0,
    )
    assert state.epoch_state is None and state.pending_pause is False
    assert "epoch_state" not in state.to_toml_dict()


def test_run_state_is_read_and_written_by_name() -> None:
    document = example_document()
    for run_state in RunState:
        document["run_state"] = run_state.name
        state = parse_state(document)
        assert state.run_state is run_state
        assert state.to_toml_dict()["run_state"] == run_state.name
    document["run_state"] = int(RunState.Warmup)  # the wire's number is not the TOML form
    assert fields_of(parse_error(document)) == ["run_state"]


# --- errors name the field ------------------------------------------------------------------


def test_unknown_keys_are_errors_naming_the_key() -> None:
    document = example_document()
    document["config"]["warmup_tme"] = 3
    document["model"]["LLM"]["optimizer"]["Distro"]["topk"] = 3
    document["surprise"] = 1
    error = parse_error(document)
    assert set(fields_of(error)) == {
        "config.warmup_tme",
        "model.LLM.optimizer.Distro.topk",
        "surprise",
    }
    assert "unknown key" in str(error)


def test_missing_required_fields_are_named() -> None:
    document = example_document()
    del document["config"]["epoch_time"]
    del document["model"]["LLM"]["cold_start_warmup_steps"]
    error = parse_error(document)
    assert set(fields_of(error)) == {"config.epoch_time", "model.LLM.cold_start_warmup_steps"}
    assert "missing" in str(error)


@pytest.mark.parametrize(
    ("section", "field", "value", "bound"),
    [
        ("config", "verification_percent", 256, "255"),
        ("config", "waiting_for_members_extra_time", 300, "255"),
        ("config", "min_clients", 65536, "65535"),
        ("config", "total_steps", 2**32, "4294967295"),
        ("config", "epoch_time", 2**64, "18446744073709551615"),
        ("config", "warmup_time", -1, "0"),
    ],
)
def test_integer_widths_are_enforced(section: str, field: str, value: int, bound: str) -> None:
    document = example_document()
    document[section][field] = value
    error = parse_error(document)
    assert fields_of(error) == [f"{section}.{field}"]
    assert bound in str(error)


def test_wrong_types_are_not_coerced() -> None:
    document = example_document()
    document["config"]["total_steps"] = "200"
    document["config"]["epoch_time"] = 1.5
    document["model"]["LLM"]["optimizer"]["Distro"]["quantize_1bit"] = "yes"
    document["model"]["LLM"]["lr_schedule"]["Cosine"]["base_lr"] = "0.1"
    error = parse_error(document)
    assert set(fields_of(error)) == {
        "config.total_steps",
        "config.epoch_time",
        "model.LLM.optimizer.Distro.quantize_1bit",
        "model.LLM.lr_schedule.Cosine.base_lr",
    }


def test_unknown_variant_lists_the_choices() -> None:
    error = parse_error(with_llm(checkpoint={"Hubb": {"repo_id": "x"}}))
    assert fields_of(error) == ["model.LLM.checkpoint"]
    assert "'Hubb'" in str(error) and "Hub, P2P" in str(error)
    error = parse_error(with_llm(optimizer={"Distro": {}, "AdamW": {}}))
    assert "exactly one key" in str(error)
    error = parse_error(with_llm(checkpoint="Hub"))
    assert "needs its fields" in str(error)
    error = parse_error(with_llm(architecture="Llama"))
    assert fields_of(error) == ["model.LLM.architecture"]


def test_scalar_variant_errors_use_the_toml_path() -> None:
    error = parse_error(with_llm(data_location={"Server": 5}))
    assert fields_of(error) == ["model.LLM.data_location.Server"]

    def http(seed: list[int]) -> dict[str, Any]:
        return {
            "Http": {
                "location": {"SingleUrl": "u"},
                "token_size_in_bytes": "TwoBytes",
                "shuffle": {"Seeded": seed},
            }
        }

    error = parse_error(with_llm(data_location=http([1, 2, 300])))
    assert fields_of(error) == ["model.LLM.data_location.Http.shuffle.Seeded[2]"]
    assert "255" in str(error)
    error = parse_error(with_llm(data_location=http([1, 2])))
    assert fields_of(error) == ["model.LLM.data_location.Http.shuffle.Seeded"]
    assert "at least 32 items (got 2)" in str(error)


def test_model_must_be_an_llm_table() -> None:
    document = example_document()
    document["model"] = {"GPT": document["model"]["LLM"]}
    error = parse_error(document)
    assert fields_of(error) == ["model"]
    assert "[model.LLM]" in str(error)


@pytest.mark.parametrize(
    ("path", "value", "limit"),
    [
        (("run_id",), "r" * 33, 32),
        (("model", "LLM", "checkpoint"), {"Hub": {"repo_id": "o/" + "n" * 63}}, 64),
        (("model", "LLM", "data_location"), {"Server": "h" * 65}, 64),
        (("model", "LLM", "data_location"), {"Local": "/" + "p" * 192}, 192),
        (("model", "LLM", "data_location"), {"WeightedHttp": "u" * 193}, 192),
    ],
)
def test_strings_over_the_reference_limits_are_errors(
    path: tuple[str, ...], value: Any, limit: int
) -> None:
    document = example_document()
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    error = parse_error(document)
    assert f"at most {limit} bytes" in str(error)
    assert fields_of(error)[0].startswith(".".join(path))


def test_run_id_is_measured_in_utf8_bytes() -> None:
    document = example_document()
    document["run_id"] = "é" * 16  # 32 bytes: fits
    assert parse_state(document).run_id == "é" * 16
    document["run_id"] = "é" * 17  # 34 bytes
    assert fields_of(parse_error(document)) == ["run_id"]


def test_run_id_argument_overrides_the_file() -> None:
    assert parse_state(example_document(), run_id="other").run_id == "other"


def test_toml_syntax_and_missing_files_raise_config_error(tmp_path: Path) -> None:
    broken = tmp_path / "state.toml"
    broken.write_text("run_id = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_state(broken)
    with pytest.raises(ConfigError, match="file not found"):
        load_state(tmp_path / "absent.toml")


# --- data.toml -----------------------------------------------------------------------------


def data_document() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "data.toml.example").read_text())


def test_data_config_example_and_relative_dir(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "data.toml"
    path.parent.mkdir()
    path.write_text(tomli_w.dumps(data_document()))
    config = load_data_config(path)
    assert config.dir == (tmp_path / "conf" / "data" / "tokens").resolve()
    assert config.seq_len == 256 and config.token_size is TokenSize.TWO_BYTES
    again = parse_data_config(
        tomllib.loads(tomli_w.dumps(config.to_toml_dict())), base_dir=tmp_path
    )
    assert again == config


def test_absolute_data_dir_is_kept(tmp_path: Path) -> None:
    document = data_document()
    document["dir"] = str(tmp_path)
    assert parse_data_config(document, base_dir="/elsewhere").dir == tmp_path


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("token_size", "ThreeBytes", "token_size"),
        ("seq_len", 0, "seq_len"),
        ("shuffle_seed", list(range(31)), "shuffle_seed"),
        ("shuffle_seed", [*range(31), 256], "shuffle_seed[31]"),
        ("sed", 1, "sed"),
    ],
)
def test_bad_data_config_names_the_field(key: str, value: Any, field: str) -> None:
    document = copy.deepcopy(data_document())
    document[key] = value
    with pytest.raises(ConfigError) as caught:
        parse_data_config(document, base_dir=".")
    assert [p.field for p in caught.value.problems] == [field]


def test_data_server_config_is_usable_from_code() -> None:
    config = DataServerConfig(
        dir=Path("/tmp/x"), token_size=TokenSize.FOUR_BYTES, seq_len=8, shuffle_seed=(0,) * 32
    )
    assert config.shuffle_seed_bytes == bytes(32)
    assert TokenSize.from_num_bytes(4) is TokenSize.FOUR_BYTES
    with pytest.raises(ValueError, match="Unsupported token bytes length"):
        TokenSize.from_num_bytes(3)
