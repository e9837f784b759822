"""The reference's `CoordinatorConfig::check_error`: the 11 rules of `[config]`, checked in the
reference's order; the first failure wins. Messages name the field and the rule in plain words."""

from __future__ import annotations

from psyche_common.config.coordinator_config import CoordinatorConfig
from psyche_common.config.errors import ConfigError, ConfigProblem

MAX_CLIENTS_PER_EPOCH = 256
MAX_WITNESSES_PER_ROUND = 32


def coordinator_config_problem(cfg: CoordinatorConfig) -> ConfigProblem | None:
    """The first broken rule of `[config]` in the reference's order, or None when all hold."""
    if cfg.epoch_time == 0:
        return ConfigProblem(
            "config.epoch_time", "config.epoch_time must be greater than 0", "EpochTime"
        )
    if cfg.warmup_time >= cfg.epoch_time:
        return ConfigProblem(
            "config.warmup_time",
            f"config.warmup_time ({cfg.warmup_time}) must be less than "
            f"config.epoch_time ({cfg.epoch_time})",
            "WarmupTime",
        )
    if cfg.max_round_train_time == 0:
        return ConfigProblem(
            "config.max_round_train_time",
            "config.max_round_train_time must be greater than 0",
            "MaxRoundTrainTime",
        )
    if cfg.max_round_train_time >= cfg.epoch_time:
        return ConfigProblem(
            "config.max_round_train_time",
            f"config.max_round_train_time ({cfg.max_round_train_time}) must be less than "
            f"config.epoch_time ({cfg.epoch_time})",
            "MaxRoundTrainTime",
        )
    if cfg.round_witness_time == 0:
        return ConfigProblem(
            "config.round_witness_time",
            "config.round_witness_time must be greater than 0",
            "RoundWitnessTime",
        )
    if cfg.min_clients == 0:
        return ConfigProblem(
            "config.min_clients", "config.min_clients must be at least 1", "MinClients"
        )
    if cfg.init_min_clients < cfg.min_clients:
        return ConfigProblem(
            "config.init_min_clients",
            f"config.init_min_clients ({cfg.init_min_clients}) must be at least "
            f"config.min_clients ({cfg.min_clients})",
            "InitMinClients",
        )
    if cfg.init_min_clients > MAX_CLIENTS_PER_EPOCH:
        return ConfigProblem(
            "config.init_min_clients",
            f"config.init_min_clients ({cfg.init_min_clients}) must be at most "
            f"{MAX_CLIENTS_PER_EPOCH} (the most clients an epoch can hold)",
            "InitMinClients",
        )
    if cfg.global_batch_size_start == 0:
        return ConfigProblem(
            "config.global_batch_size_start",
            "config.global_batch_size_start must be greater than 0",
            "GlobalBatchSize",
        )
    if cfg.global_batch_size_end == 0:
        return ConfigProblem(
            "config.global_batch_size_end",
            "config.global_batch_size_end must be greater than 0",
            "GlobalBatchSize",
        )
    if cfg.global_batch_size_end < cfg.global_batch_size_start:
        return ConfigProblem(
            "config.global_batch_size_end",
            f"config.global_batch_size_end ({cfg.global_batch_size_end}) must be at least "
            f"config.global_batch_size_start ({cfg.global_batch_size_start})",
            "GlobalBatchSize",
        )
    if cfg.total_steps == 0:
        return ConfigProblem(
            "config.total_steps", "config.total_steps must be greater than 0", "TotalSteps"
        )
    if cfg.witness_nodes > cfg.min_clients:
        return ConfigProblem(
            "config.witness_nodes",
            f"config.witness_nodes ({cfg.witness_nodes}) must be at most "
            f"config.min_clients ({cfg.min_clients})",
            "WitnessNodes",
        )
    if cfg.witness_nodes > MAX_WITNESSES_PER_ROUND:
        return ConfigProblem(
            "config.witness_nodes",
            f"config.witness_nodes ({cfg.witness_nodes}) must be at most "
            f"{MAX_WITNESSES_PER_ROUND} (0 means all clients, capped at {MAX_WITNESSES_PER_ROUND})",
            "WitnessNodes",
        )
    if cfg.cooldown_time == 0:
        return ConfigProblem(
            "config.cooldown_time", "config.cooldown_time must be greater than 0", "CooldownTime"
        )
    if cfg.waiting_for_members_extra_time == 0:
        return ConfigProblem(
            "config.waiting_for_members_extra_time",
            "config.waiting_for_members_extra_time must be greater than 0",
            "WaitingForMembersExtraTime",
        )
    return None


def validate_coordinator_config(cfg: CoordinatorConfig) -> None:
    """Raise `ConfigError` with the first broken `[config]` rule (reference order)."""
    problem = coordinator_config_problem(cfg)
    if problem is not None:
        raise ConfigError([problem])
