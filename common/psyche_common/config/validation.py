"""Run rules for a loaded configuration.

`coordinator_config_problem` is the reference's `CoordinatorConfig::check_error`: its 11 rules in
the reference's order, the first failure wins. `validate_state` adds the checks the reference only
runs on Solana (model, cold start, progress) and ours (string limits are enforced at load time;
here: data.toml `seq_len` against `max_seq_len`, `verification_percent`, LR schedule sanity), and
returns errors and warnings. Dummy data, Dummy optimizer and Dummy checkpoint stay valid (tests
use them); an Ephemeral checkpoint is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from psyche_common.config.checkpoint import (
    EphemeralCheckpoint,
    GcsCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
    P2PGcsCheckpoint,
)
from psyche_common.config.coordinator_rules import coordinator_config_problem
from psyche_common.config.data_location import (
    BuiltinData,
    Gcp,
    HttpData,
    NumberedFiles,
    PreprocessedData,
    ServerData,
    SingleUrl,
    WeightedHttpData,
)
from psyche_common.config.data_server import DataServerConfig
from psyche_common.config.errors import ConfigError, ConfigProblem
from psyche_common.config.lr_schedule import CosineLR, WarmupStableDecayLR
from psyche_common.config.model import LLMConfig
from psyche_common.config.optimizer import DistroOptimizer
from psyche_common.config.state_file import StateFile

BUILTIN_DATASETS = ("python-stdlib",)
"""Names of the `{ Builtin = ... }` corpora the data providers know."""

_LLM = "model.LLM"


def _problem(field_path: str, message: str, rule: str) -> ConfigProblem:
    return ConfigProblem(field=field_path, message=message, rule=rule)


def _data_location_problems(model: LLMConfig) -> list[ConfigProblem]:
    location = model.data_location
    base = f"{_LLM}.data_location"
    empty = "must not be empty"
    if isinstance(location, ServerData) and not location.address:
        return [_problem(f"{base}.Server", f"{base}.Server (host:port) {empty}", "ModelCheck")]
    if isinstance(location, WeightedHttpData) and not location.url:
        return [_problem(f"{base}.WeightedHttp", f"{base}.WeightedHttp url {empty}", "ModelCheck")]
    if isinstance(location, PreprocessedData) and not location.url:
        return [_problem(f"{base}.Preprocessed", f"{base}.Preprocessed url {empty}", "ModelCheck")]
    if isinstance(location, BuiltinData) and not location.name:
        return [_problem(f"{base}.Builtin", f"{base}.Builtin name {empty}", "ModelCheck")]
    if isinstance(location, HttpData):
        http = f"{base}.Http.location"
        inner = location.location
        if isinstance(inner, SingleUrl) and not inner.url:
            return [_problem(f"{http}.SingleUrl", f"{http}.SingleUrl {empty}", "ModelCheck")]
        if isinstance(inner, NumberedFiles):
            where = f"{http}.NumberedFiles"
            if not inner.url_template:
                return [
                    _problem(f"{where}.url_template", f"{where}.url_template {empty}", "ModelCheck")
                ]
            if inner.num_files == 0:
                return [
                    _problem(
                        f"{where}.num_files", f"{where}.num_files must be at least 1", "ModelCheck"
                    )
                ]
        if isinstance(inner, Gcp) and not inner.bucket_name:
            return [
                _problem(f"{http}.Gcp.bucket_name", f"{http}.Gcp.bucket_name {empty}", "ModelCheck")
            ]
    return []


def _checkpoint_problems(model: LLMConfig) -> list[ConfigProblem]:
    checkpoint = model.checkpoint
    base = f"{_LLM}.checkpoint"
    if isinstance(checkpoint, EphemeralCheckpoint):
        return [
            _problem(
                base,
                f'{base} "Ephemeral" cannot start a run: clients would have no weights to load '
                "(use Hub, Gcs or Dummy)",
                "ModelCheck",
            )
        ]
    if isinstance(checkpoint, HubCheckpoint | P2PCheckpoint) and not checkpoint.repo_id:
        where = f"{base}.{checkpoint.kind}.repo_id"
        return [_problem(where, f"{where} must not be empty", "ModelCheck")]
    if isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint) and not checkpoint.bucket:
        where = f"{base}.{checkpoint.kind}.bucket"
        return [_problem(where, f"{where} must not be empty", "ModelCheck")]
    return []


def _lr_schedule_problems(model: LLMConfig) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    errors: list[ConfigProblem] = []
    warnings: list[ConfigProblem] = []
    schedule = model.lr_schedule
    if isinstance(schedule, WarmupStableDecayLR):
        base = f"{_LLM}.lr_schedule.WarmupStableDecay"
        if schedule.cosine_decay_final_lr > schedule.base_lr:
            errors.append(
                _problem(
                    f"{base}.cosine_decay_final_lr",
                    f"{base}.cosine_decay_final_lr ({schedule.cosine_decay_final_lr}) must be at "
                    f"most base_lr ({schedule.base_lr})",
                    "LRSchedule",
                )
            )
        if schedule.linear_decay_final_lr > schedule.cosine_decay_final_lr:
            errors.append(
                _problem(
                    f"{base}.linear_decay_final_lr",
                    f"{base}.linear_decay_final_lr ({schedule.linear_decay_final_lr}) must be at "
                    f"most cosine_decay_final_lr ({schedule.cosine_decay_final_lr})",
                    "LRSchedule",
                )
            )
    if isinstance(schedule, CosineLR) and schedule.total_steps <= schedule.warmup_steps:
        base = f"{_LLM}.lr_schedule.Cosine"
        warnings.append(
            _problem(
                f"{base}.total_steps",
                f"{base}.total_steps ({schedule.total_steps}) is not greater than warmup_steps "
                f"({schedule.warmup_steps}): there is no cosine phase, the LR drops to final_lr "
                "right after the warmup",
                "LRSchedule",
            )
        )
    return errors, warnings


def _optimizer_problems(model: LLMConfig) -> list[ConfigProblem]:
    optimizer = model.optimizer
    if not isinstance(optimizer, DistroOptimizer):
        return []
    base = f"{_LLM}.optimizer.Distro"
    problems = []
    if optimizer.compression_chunk == 0:
        problems.append(
            _problem(
                f"{base}.compression_chunk",
                f"{base}.compression_chunk must be at least 1",
                "Optimizer",
            )
        )
    if optimizer.compression_topk == 0:
        problems.append(
            _problem(
                f"{base}.compression_topk",
                f"{base}.compression_topk must be at least 1",
                "Optimizer",
            )
        )
    return problems


def _cold_start_problem(state: StateFile) -> ConfigProblem | None:
    model, cfg = state.model, state.config
    steps = model.cold_start_warmup_steps
    if steps == 0 or cfg.max_round_train_time == 0 or cfg.warmup_time >= cfg.epoch_time:
        return None  # nothing to check, or [config] is already reported as broken
    rounds_per_epoch = (cfg.epoch_time - cfg.warmup_time) // cfg.max_round_train_time
    if steps <= rounds_per_epoch:
        return None
    return _problem(
        f"{_LLM}.cold_start_warmup_steps",
        f"{_LLM}.cold_start_warmup_steps ({steps}) must be at most the number of rounds that fit "
        f"in an epoch, (config.epoch_time - config.warmup_time) // config.max_round_train_time "
        f"= {rounds_per_epoch}",
        "ColdStartWarmupSteps",
    )


@dataclass
class ValidationReport:
    """Outcome of `validate_state`: errors make the configuration unusable, warnings do not."""

    errors: list[ConfigProblem] = field(default_factory=list)
    warnings: list[ConfigProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_if_errors(self, source: Path | str | None = None) -> None:
        if self.errors:
            raise ConfigError(self.errors, source)


def validate_state(
    state: StateFile, data_config: DataServerConfig | None = None
) -> ValidationReport:
    """Every run rule on a loaded state file (and its data.toml, when given)."""
    report = ValidationReport()
    errors, warnings = report.errors, report.warnings
    cfg, model = state.config, state.model

    first_config_problem = coordinator_config_problem(cfg)
    if first_config_problem is not None:
        errors.append(first_config_problem)
    if not state.run_id:
        errors.append(_problem("run_id", "run_id must not be empty", "RunId"))
    if cfg.verification_percent > 100:
        errors.append(
            _problem(
                "config.verification_percent",
                f"config.verification_percent ({cfg.verification_percent}) must be at most 100",
                "VerificationPercent",
            )
        )
    elif cfg.verification_percent > 0:
        warnings.append(
            _problem(
                "config.verification_percent",
                f"config.verification_percent is {cfg.verification_percent}: verifier committees "
                "are not supported (the reference's clients assert that it is 0); use 0",
                "VerificationPercent",
            )
        )

    if model.max_seq_len == 0:
        errors.append(
            _problem(
                f"{_LLM}.max_seq_len", f"{_LLM}.max_seq_len must be greater than 0", "ModelCheck"
            )
        )
    errors.extend(_data_location_problems(model))
    errors.extend(_checkpoint_problems(model))
    errors.extend(_optimizer_problems(model))
    lr_errors, lr_warnings = _lr_schedule_problems(model)
    errors.extend(lr_errors)
    warnings.extend(lr_warnings)
    cold_start = _cold_start_problem(state)
    if cold_start is not None:
        errors.append(cold_start)
    if state.progress.step == 0:
        errors.append(
            _problem(
                "progress.step", "progress.step must be at least 1 (steps count from 1)", "Progress"
            )
        )

    location = model.data_location
    if (
        isinstance(location, BuiltinData)
        and location.name
        and location.name not in BUILTIN_DATASETS
    ):
        warnings.append(
            _problem(
                f"{_LLM}.data_location.Builtin",
                f"{_LLM}.data_location.Builtin {location.name!r} is not a known "
                f"builtin corpus (known: {', '.join(BUILTIN_DATASETS)})",
                "DataLocation",
            )
        )
    _check_data_config(state, data_config, report)
    return report


def _check_data_config(
    state: StateFile, data_config: DataServerConfig | None, report: ValidationReport
) -> None:
    uses_server = isinstance(state.model.data_location, ServerData)
    if data_config is None:
        if uses_server:
            report.warnings.append(
                _problem(
                    "data_config",
                    f"{_LLM}.data_location is a data Server: `psyche-server run` needs "
                    "--data-config data.toml to serve it",
                    "DataConfig",
                )
            )
        return
    if not uses_server:
        report.warnings.append(
            _problem(
                "data_config",
                f"a data.toml was given but {_LLM}.data_location is "
                f"{state.model.data_location.kind}, not Server: it will not be used",
                "DataConfig",
            )
        )
    if data_config.seq_len != state.model.max_seq_len:
        report.errors.append(
            _problem(
                "data.seq_len",
                f"data.toml seq_len ({data_config.seq_len}) must equal "
                f"{_LLM}.max_seq_len ({state.model.max_seq_len})",
                "SeqLen",
            )
        )
    missing = data_dir_problem(data_config)
    if missing is not None:
        report.warnings.append(missing)


def data_dir_problem(data_config: DataServerConfig) -> ConfigProblem | None:
    """Why data.toml's `dir` cannot be served (missing, not a directory), or None."""
    directory = data_config.dir
    if not directory.exists():
        return _problem("data.dir", f"data.toml dir {directory} does not exist", "DataDir")
    if not directory.is_dir():
        return _problem("data.dir", f"data.toml dir {directory} is not a directory", "DataDir")
    return None


def require_data_dir(data_config: DataServerConfig, source: Path | str | None = None) -> None:
    """For `psyche-server run`: raise `ConfigError` when the data directory cannot be served."""
    problem = data_dir_problem(data_config)
    if problem is not None:
        raise ConfigError([problem], source)


def check_state(
    state: StateFile,
    data_config: DataServerConfig | None = None,
    source: Path | str | None = None,
) -> list[ConfigProblem]:
    """`validate_state`, raising `ConfigError` on errors; returns the warnings otherwise."""
    report = validate_state(state, data_config)
    report.raise_if_errors(source)
    return report.warnings
