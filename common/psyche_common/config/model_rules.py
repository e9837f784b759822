"""Rules for the `[model.LLM]` section: data location, checkpoint, optimizer (in
`optimizer_rules`), LR schedule, cold start, architecture (in `architecture_rules`). The
reference runs most of them only on Solana; we run them everywhere. Dummy data, Dummy optimizer
and Dummy checkpoint stay valid (tests use them); an Ephemeral checkpoint is an error, an unknown
builtin corpus a warning.
"""

from __future__ import annotations

from psyche_common.config.architecture_rules import architecture_problems
from psyche_common.config.checkpoint import (
    EphemeralCheckpoint,
    GcsCheckpoint,
    HubCheckpoint,
    P2PCheckpoint,
    P2PGcsCheckpoint,
)
from psyche_common.config.data_location import (
    BUILTIN_DATASETS,
    BuiltinData,
    Gcp,
    HttpData,
    NumberedFiles,
    PreprocessedData,
    ServerData,
    SingleUrl,
    WeightedHttpData,
)
from psyche_common.config.errors import ConfigProblem
from psyche_common.config.lr_schedule import CosineLR, WarmupStableDecayLR
from psyche_common.config.model import LLMConfig
from psyche_common.config.optimizer_rules import optimizer_problems
from psyche_common.config.state_file import StateFile

_LLM = "model.LLM"


def _must_not_be_empty(field_path: str, label: str | None = None) -> list[ConfigProblem]:
    """The `ModelCheck` error of a required text field left empty (`label` names it, if given)."""
    return [ConfigProblem(field_path, f"{label or field_path} must not be empty", "ModelCheck")]


def _data_location_problems(model: LLMConfig) -> list[ConfigProblem]:
    location = model.data_location
    base = f"{_LLM}.data_location"
    if isinstance(location, ServerData) and not location.address:
        return _must_not_be_empty(f"{base}.Server", f"{base}.Server (host:port)")
    if isinstance(location, WeightedHttpData) and not location.url:
        return _must_not_be_empty(f"{base}.WeightedHttp", f"{base}.WeightedHttp url")
    if isinstance(location, PreprocessedData) and not location.url:
        return _must_not_be_empty(f"{base}.Preprocessed", f"{base}.Preprocessed url")
    if isinstance(location, BuiltinData) and not location.name:
        return _must_not_be_empty(f"{base}.Builtin", f"{base}.Builtin name")
    if isinstance(location, HttpData):
        http = f"{base}.Http.location"
        inner = location.location
        if isinstance(inner, SingleUrl) and not inner.url:
            return _must_not_be_empty(f"{http}.SingleUrl")
        if isinstance(inner, NumberedFiles):
            where = f"{http}.NumberedFiles"
            if not inner.url_template:
                return _must_not_be_empty(f"{where}.url_template")
            if inner.num_files == 0:
                return [
                    ConfigProblem(
                        f"{where}.num_files", f"{where}.num_files must be at least 1", "ModelCheck"
                    )
                ]
        if isinstance(inner, Gcp) and not inner.bucket_name:
            return _must_not_be_empty(f"{http}.Gcp.bucket_name")
    return []


def _checkpoint_problems(model: LLMConfig) -> list[ConfigProblem]:
    checkpoint = model.checkpoint
    base = f"{_LLM}.checkpoint"
    if isinstance(checkpoint, EphemeralCheckpoint):
        return [
            ConfigProblem(
                base,
                f'{base} "Ephemeral" cannot start a run: clients would have no weights to load '
                "(use Hub or Dummy)",
                "ModelCheck",
            )
        ]
    if isinstance(checkpoint, HubCheckpoint | P2PCheckpoint) and not checkpoint.repo_id:
        return _must_not_be_empty(f"{base}.{checkpoint.kind}.repo_id")
    if isinstance(checkpoint, GcsCheckpoint | P2PGcsCheckpoint) and not checkpoint.bucket:
        return _must_not_be_empty(f"{base}.{checkpoint.kind}.bucket")
    return []


def _lr_schedule_problems(model: LLMConfig) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    errors: list[ConfigProblem] = []
    warnings: list[ConfigProblem] = []
    schedule = model.lr_schedule
    if isinstance(schedule, WarmupStableDecayLR):
        base = f"{_LLM}.lr_schedule.WarmupStableDecay"
        if schedule.cosine_decay_final_lr > schedule.base_lr:
            errors.append(
                ConfigProblem(
                    f"{base}.cosine_decay_final_lr",
                    f"{base}.cosine_decay_final_lr ({schedule.cosine_decay_final_lr}) must be at "
                    f"most base_lr ({schedule.base_lr})",
                    "LRSchedule",
                )
            )
        if schedule.linear_decay_final_lr > schedule.cosine_decay_final_lr:
            errors.append(
                ConfigProblem(
                    f"{base}.linear_decay_final_lr",
                    f"{base}.linear_decay_final_lr ({schedule.linear_decay_final_lr}) must be at "
                    f"most cosine_decay_final_lr ({schedule.cosine_decay_final_lr})",
                    "LRSchedule",
                )
            )
    if isinstance(schedule, CosineLR) and schedule.total_steps <= schedule.warmup_steps:
        base = f"{_LLM}.lr_schedule.Cosine"
        warnings.append(
            ConfigProblem(
                f"{base}.total_steps",
                f"{base}.total_steps ({schedule.total_steps}) is not greater than warmup_steps "
                f"({schedule.warmup_steps}): there is no cosine phase, the LR drops to final_lr "
                "right after the warmup",
                "LRSchedule",
            )
        )
    return errors, warnings


def _cold_start_problem(state: StateFile) -> ConfigProblem | None:
    model, cfg = state.model, state.config
    steps = model.cold_start_warmup_steps
    if steps == 0 or cfg.max_round_train_time == 0 or cfg.warmup_time >= cfg.epoch_time:
        return None  # nothing to check, or [config] is already reported as broken
    rounds_per_epoch = (cfg.epoch_time - cfg.warmup_time) // cfg.max_round_train_time
    if steps <= rounds_per_epoch:
        return None
    return ConfigProblem(
        f"{_LLM}.cold_start_warmup_steps",
        f"{_LLM}.cold_start_warmup_steps ({steps}) must be at most the number of rounds that fit "
        f"in an epoch, (config.epoch_time - config.warmup_time) // config.max_round_train_time "
        f"= {rounds_per_epoch}",
        "ColdStartWarmupSteps",
    )


def _builtin_data_warning(model: LLMConfig) -> ConfigProblem | None:
    location = model.data_location
    if not isinstance(location, BuiltinData) or not location.name:
        return None
    if location.name in BUILTIN_DATASETS:
        return None
    return ConfigProblem(
        f"{_LLM}.data_location.Builtin",
        f"{_LLM}.data_location.Builtin {location.name!r} is not a known "
        f"builtin corpus (known: {', '.join(BUILTIN_DATASETS)})",
        "DataLocation",
    )


def model_problems(state: StateFile) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    """(errors, warnings) of the `[model.LLM]` section, in a fixed order."""
    model = state.model
    errors: list[ConfigProblem] = []
    if model.max_seq_len == 0:
        errors.append(
            ConfigProblem(
                f"{_LLM}.max_seq_len", f"{_LLM}.max_seq_len must be greater than 0", "ModelCheck"
            )
        )
    architecture_errors, architecture_warnings = architecture_problems(state)
    errors.extend(architecture_errors)
    errors.extend(_data_location_problems(model))
    errors.extend(_checkpoint_problems(model))
    optimizer_errors, optimizer_warnings = optimizer_problems(state)
    errors.extend(optimizer_errors)
    lr_errors, warnings = _lr_schedule_problems(model)
    errors.extend(lr_errors)
    warnings.extend(optimizer_warnings)
    cold_start = _cold_start_problem(state)
    if cold_start is not None:
        errors.append(cold_start)
    warnings.extend(architecture_warnings)
    builtin_warning = _builtin_data_warning(model)
    if builtin_warning is not None:
        warnings.append(builtin_warning)
    return errors, warnings
