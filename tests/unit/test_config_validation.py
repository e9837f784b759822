"""Run rules: the reference's 11 `[config]` rules in order, model checks, our additions."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from psyche_common.config import (
    ConfigError,
    CoordinatorConfig,
    DataServerConfig,
    StateFile,
    TokenSize,
    check_state,
    coordinator_config_problem,
    load_data_config,
    load_state,
    parse_state,
    require_data_dir,
    validate_coordinator_config,
    validate_state,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def example_document() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "state.toml.example").read_text())


def example_state(**llm_changes: Any) -> StateFile:
    document = example_document()
    document["model"]["LLM"].update(llm_changes)
    return parse_state(document)


def config_with(**changes: float) -> CoordinatorConfig:
    return example_state().config.model_copy(update=changes)


def test_example_and_fixtures_are_valid(shared_fixtures: Path) -> None:
    assert validate_state(example_state()).ok
    for path in sorted((shared_fixtures / "configs").glob("*/state.toml")):
        data_path = path.parent / "data.toml"
        data = load_data_config(data_path) if data_path.exists() else None
        report = validate_state(load_state(path), data)
        assert report.ok, (path, report.errors)
    for path in sorted((shared_fixtures / "configs" / "solana-test").glob("*.toml")):
        report = validate_state(load_state(path, run_id="solana"))
        if path.name == "light-config-gcs.toml":  # the client cannot load from GCS
            assert [p.field for p in report.errors] == ["model.LLM.checkpoint.Gcs"], path
        else:
            assert report.ok, path


def test_verification_percent_fixture_validates_without_a_warning(shared_fixtures: Path) -> None:
    # verifiers exist now (docs/verification.md): a verification_percent above 0 is a setting
    path = shared_fixtures / "configs" / "llama2-20m-dolma-verify-first-checkpointer" / "state.toml"
    report = validate_state(load_state(path))
    assert report.ok
    assert [w.field for w in report.warnings] == ["data_config"]


@pytest.mark.parametrize("percent", [1, 25, 50, 100])
def test_verification_percent_up_to_100_is_valid(percent: int) -> None:
    state = example_state().model_copy(update={"config": config_with(verification_percent=percent)})
    report = validate_state(state)
    assert report.ok, report.errors
    assert "config.verification_percent" not in [w.field for w in report.warnings]


# One case per reference rule, in the reference's order: (changes, field, rule, words).
RULE_CASES = [
    ({"epoch_time": 0}, "config.epoch_time", "EpochTime", "greater than 0"),
    (
        {"warmup_time": 60, "epoch_time": 60},
        "config.warmup_time",
        "WarmupTime",
        "config.warmup_time (60) must be less than config.epoch_time (60)",
    ),
    ({"max_round_train_time": 0}, "config.max_round_train_time", "MaxRoundTrainTime", "greater"),
    (
        {"max_round_train_time": 120},
        "config.max_round_train_time",
        "MaxRoundTrainTime",
        "config.max_round_train_time (120) must be less than config.epoch_time (120)",
    ),
    ({"round_witness_time": 0}, "config.round_witness_time", "RoundWitnessTime", "greater"),
    ({"min_clients": 0, "witness_nodes": 0}, "config.min_clients", "MinClients", "at least 1"),
    (
        {"init_min_clients": 1, "min_clients": 2},
        "config.init_min_clients",
        "InitMinClients",
        "config.init_min_clients (1) must be at least config.min_clients (2)",
    ),
    ({"init_min_clients": 257}, "config.init_min_clients", "InitMinClients", "at most 256"),
    (
        {"global_batch_size_start": 0},
        "config.global_batch_size_start",
        "GlobalBatchSize",
        "greater than 0",
    ),
    (
        {"global_batch_size_end": 0},
        "config.global_batch_size_end",
        "GlobalBatchSize",
        "greater than 0",
    ),
    (
        {"global_batch_size_start": 9, "global_batch_size_end": 8},
        "config.global_batch_size_end",
        "GlobalBatchSize",
        "(8) must be at least config.global_batch_size_start (9)",
    ),
    ({"total_steps": 0}, "config.total_steps", "TotalSteps", "greater than 0"),
    (
        {"witness_nodes": 3},
        "config.witness_nodes",
        "WitnessNodes",
        "config.witness_nodes (3) must be at most config.min_clients (2)",
    ),
    (
        {"witness_nodes": 33, "min_clients": 40, "init_min_clients": 40},
        "config.witness_nodes",
        "WitnessNodes",
        "at most 32",
    ),
    ({"cooldown_time": 0}, "config.cooldown_time", "CooldownTime", "greater than 0"),
    (
        {"waiting_for_members_extra_time": 0},
        "config.waiting_for_members_extra_time",
        "WaitingForMembersExtraTime",
        "greater than 0",
    ),
]


@pytest.mark.parametrize(
    ("changes", "field", "rule", "words"), RULE_CASES, ids=[case[2] for case in RULE_CASES]
)
def test_each_reference_rule(changes: dict[str, int], field: str, rule: str, words: str) -> None:
    problem = coordinator_config_problem(config_with(**changes))
    assert problem is not None
    assert (problem.field, problem.rule) == (field, rule)
    assert words in problem.message
    with pytest.raises(ConfigError) as caught:
        validate_coordinator_config(config_with(**changes))
    assert caught.value.problems == [problem]
    assert field in str(caught.value)


@pytest.mark.parametrize("seconds", [1, 2, 0.2, 0.05, 1.5, 0.001])
def test_round_witness_time_takes_whole_seconds_or_milliseconds(seconds: float) -> None:
    document = example_document()
    document["config"]["round_witness_time"] = seconds
    state = parse_state(tomllib.loads(tomli_w.dumps(document)))
    assert state.config.round_witness_time == seconds
    assert type(state.config.round_witness_time) is type(seconds)  # an integer stays one
    assert validate_state(state).ok


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0.0005, "not a whole number of milliseconds"),
        (-0.5, "non-negative"),
        (float("inf"), "finite"),
        (float("nan"), "finite"),
        ("0.2", "must be a number of seconds"),
        (True, "must be a number of seconds"),
        (-1, "between 0 and"),
    ],
)
def test_round_witness_time_refuses_what_is_not_milliseconds(value: object, words: str) -> None:
    document = example_document()
    document["config"]["round_witness_time"] = value
    with pytest.raises(ConfigError) as caught:
        parse_state(document)
    assert "config.round_witness_time" in str(caught.value)
    assert words in str(caught.value)


def test_round_witness_time_zero_breaks_its_rule_as_a_decimal_too() -> None:
    problem = coordinator_config_problem(config_with(round_witness_time=0.0))
    assert problem is not None and problem.rule == "RoundWitnessTime"


def test_first_failing_rule_wins() -> None:
    # Breaks WarmupTime (rule 2), TotalSteps (8) and CooldownTime (10) at once.
    cfg = config_with(warmup_time=500, total_steps=0, cooldown_time=0)
    problem = coordinator_config_problem(cfg)
    assert problem is not None and problem.rule == "WarmupTime"
    # Rules 8 and 10 together: TotalSteps first.
    problem = coordinator_config_problem(config_with(total_steps=0, cooldown_time=0))
    assert problem is not None and problem.rule == "TotalSteps"
    state = example_state().model_copy(update={"config": cfg})
    report = validate_state(state)
    assert [p.rule for p in report.errors] == ["WarmupTime"]


def test_witness_nodes_zero_means_all_and_is_valid() -> None:
    assert coordinator_config_problem(config_with(witness_nodes=0)) is None


def test_unchecked_reference_fields_stay_unchecked() -> None:
    assert coordinator_config_problem(config_with(global_batch_size_warmup_tokens=0)) is None
    assert coordinator_config_problem(config_with(verification_percent=200)) is None


def errors_of(state: StateFile, data: DataServerConfig | None = None) -> list[tuple[str, str]]:
    return [(p.field, p.message) for p in validate_state(state, data).errors]


def only_error_field(state: StateFile, data: DataServerConfig | None = None) -> str:
    errors = errors_of(state, data)
    assert len(errors) == 1, errors
    return errors[0][0]


def test_verification_percent_over_100_is_an_error() -> None:
    state = example_state().model_copy(update={"config": config_with(verification_percent=101)})
    assert only_error_field(state) == "config.verification_percent"


def test_max_seq_len_zero() -> None:
    assert only_error_field(example_state(max_seq_len=0)) == "model.LLM.max_seq_len"


def test_ephemeral_checkpoint_is_invalid_and_dummy_things_are_valid() -> None:
    assert only_error_field(example_state(checkpoint="Ephemeral")) == "model.LLM.checkpoint"
    state = example_state(
        checkpoint={"Dummy": {"repo_id": ""}}, optimizer="Dummy", data_location="Dummy"
    )
    assert validate_state(state).ok


@pytest.mark.parametrize(
    ("checkpoint", "field"),
    [
        ({"Hub": {"repo_id": ""}}, "model.LLM.checkpoint.Hub.repo_id"),
        ({"P2P": {"repo_id": ""}}, "model.LLM.checkpoint.P2P.repo_id"),
        ({"Gcs": {"bucket": ""}}, "model.LLM.checkpoint.Gcs.bucket"),
        ({"P2PGcs": {"bucket": ""}}, "model.LLM.checkpoint.P2PGcs.bucket"),
    ],
)
def test_empty_checkpoint_locations(checkpoint: Any, field: str) -> None:
    assert only_error_field(example_state(checkpoint=checkpoint)) == field


def http(location: Any) -> dict[str, Any]:
    return {
        "Http": {"location": location, "token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle"}
    }


def numbered(template: str, num_files: int) -> dict[str, Any]:
    return {
        "NumberedFiles": {
            "url_template": template,
            "start_index": 0,
            "n_left_pad_zeros": 0,
            "num_files": num_files,
        }
    }


@pytest.mark.parametrize(
    ("location", "field"),
    [
        ({"Server": ""}, "model.LLM.data_location.Server"),
        ({"WeightedHttp": ""}, "model.LLM.data_location.WeightedHttp"),
        ({"Preprocessed": ""}, "model.LLM.data_location.Preprocessed"),
        ({"Builtin": ""}, "model.LLM.data_location.Builtin"),
        (http({"SingleUrl": ""}), "model.LLM.data_location.Http.location.SingleUrl"),
        (
            http(numbered("", 2)),
            "model.LLM.data_location.Http.location.NumberedFiles.url_template",
        ),
        (
            http(numbered("u{}", 0)),
            "model.LLM.data_location.Http.location.NumberedFiles.num_files",
        ),
        (
            http({"Gcp": {"bucket_name": "", "filter_directory": "d"}}),
            "model.LLM.data_location.Http.location.Gcp.bucket_name",
        ),
    ],
)
def test_empty_data_locations(location: Any, field: str) -> None:
    assert only_error_field(example_state(data_location=location)) == field


def test_local_data_is_always_accepted() -> None:
    assert validate_state(example_state(data_location={"Local": ""})).ok


def test_unknown_builtin_corpus_only_warns() -> None:
    report = validate_state(example_state(data_location={"Builtin": "python-stdlb"}))
    assert report.ok
    assert [w.field for w in report.warnings] == ["model.LLM.data_location.Builtin"]


def test_cold_start_warmup_steps_bound() -> None:
    # example: (120 - 30) // 30 = 3 rounds per epoch
    assert validate_state(example_state(cold_start_warmup_steps=3)).ok
    errors = errors_of(example_state(cold_start_warmup_steps=4))
    assert [field for field, _ in errors] == ["model.LLM.cold_start_warmup_steps"]
    assert "= 3" in errors[0][1]


def test_cold_start_is_not_checked_when_config_is_broken() -> None:
    state = example_state(cold_start_warmup_steps=4)
    state = state.model_copy(update={"config": config_with(max_round_train_time=0)})
    assert [p.rule for p in validate_state(state).errors] == ["MaxRoundTrainTime"]


def test_progress_step_zero() -> None:
    state = example_state()
    state = state.model_copy(update={"progress": state.progress.model_copy(update={"step": 0})})
    assert only_error_field(state) == "progress.step"


def test_empty_run_id() -> None:
    assert only_error_field(example_state().model_copy(update={"run_id": ""})) == "run_id"


def test_distro_chunk_and_topk_must_be_positive() -> None:
    distro = example_document()["model"]["LLM"]["optimizer"]
    distro["Distro"]["compression_topk"] = 0
    assert only_error_field(example_state(optimizer=distro)) == (
        "model.LLM.optimizer.Distro.compression_topk"
    )
    distro["Distro"]["compression_topk"] = 8
    distro["Distro"]["compression_chunk"] = 0
    assert only_error_field(example_state(optimizer=distro)) == (
        "model.LLM.optimizer.Distro.compression_chunk"
    )


def wsd(cosine_final: float, linear_final: float) -> dict[str, Any]:
    return {
        "WarmupStableDecay": {
            "base_lr": 1e-3,
            "warmup_steps": 10,
            "warmup_init_lr": 0.0,
            "stable_steps": 10,
            "cosine_decay_steps": 10,
            "cosine_decay_final_lr": cosine_final,
            "linear_decay_steps": 10,
            "linear_decay_final_lr": linear_final,
        }
    }


def test_warmup_stable_decay_ordering() -> None:
    assert validate_state(example_state(lr_schedule=wsd(1e-4, 1e-5))).ok
    assert only_error_field(example_state(lr_schedule=wsd(2e-3, 1e-5))) == (
        "model.LLM.lr_schedule.WarmupStableDecay.cosine_decay_final_lr"
    )
    assert only_error_field(example_state(lr_schedule=wsd(1e-4, 2e-4))) == (
        "model.LLM.lr_schedule.WarmupStableDecay.linear_decay_final_lr"
    )


def test_degenerate_cosine_only_warns() -> None:
    cosine = example_document()["model"]["LLM"]["lr_schedule"]
    cosine["Cosine"]["total_steps"] = cosine["Cosine"]["warmup_steps"]
    report = validate_state(example_state(lr_schedule=cosine))
    assert report.ok
    assert [w.field for w in report.warnings] == ["model.LLM.lr_schedule.Cosine.total_steps"]


def data_config(tmp_path: Path, seq_len: int) -> DataServerConfig:
    return DataServerConfig(
        dir=tmp_path, token_size=TokenSize.TWO_BYTES, seq_len=seq_len, shuffle_seed=(1,) * 32
    )


def test_data_seq_len_must_equal_max_seq_len(tmp_path: Path) -> None:
    state = example_state(data_location={"Server": "127.0.0.1:20001"})
    assert validate_state(state, data_config(tmp_path, 256)).ok
    errors = errors_of(state, data_config(tmp_path, 512))
    assert errors == [
        ("data.seq_len", "data.toml seq_len (512) must equal model.LLM.max_seq_len (256)")
    ]


def test_missing_data_dir_warns_in_validation_and_fails_for_run(tmp_path: Path) -> None:
    state = example_state(data_location={"Server": "127.0.0.1:20001"})
    missing = data_config(tmp_path / "absent", 256)
    report = validate_state(state, missing)
    assert report.ok
    assert [w.field for w in report.warnings] == ["data.dir"]
    with pytest.raises(ConfigError, match="does not exist"):
        require_data_dir(missing)
    a_file = tmp_path / "file.bin"
    a_file.write_bytes(b"")
    with pytest.raises(ConfigError, match="is not a directory"):
        require_data_dir(data_config(a_file, 256))
    require_data_dir(data_config(tmp_path, 256))


def test_server_data_without_data_config_warns() -> None:
    report = validate_state(example_state(data_location={"Server": "127.0.0.1:20001"}))
    assert report.ok
    assert [w.field for w in report.warnings] == ["data_config"]


def test_check_state_raises_with_every_error() -> None:
    state = example_state(max_seq_len=0, checkpoint="Ephemeral")
    with pytest.raises(ConfigError) as caught:
        check_state(state, source="state.toml")
    assert [p.field for p in caught.value.problems] == [
        "model.LLM.max_seq_len",
        "model.LLM.checkpoint",
    ]
    assert "state.toml" in str(caught.value)
    assert check_state(example_state()) == []


def test_round_witness_time_of_large_whole_milliseconds_is_accepted() -> None:
    """16817707.109 * 1000 is not exact in binary floating point; the value as written has 3
    decimals (hypothesis once drew it and the validator refused it)."""
    from psyche_common.config._types import _ms_seconds

    assert _ms_seconds(16817707.109) == 16817707.109
