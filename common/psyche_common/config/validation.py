"""Run rules for a loaded configuration.

`validate_state` runs `coordinator_config_problem` (the reference's `CoordinatorConfig::check_error`,
its 11 rules in the reference's order, the first failure wins), the `[model.LLM]` rules of
`model_rules` (which the reference only runs on Solana), our LR-schedule rules (`lr_rules`)
and what the client cannot load or use (`support_rules`), the run id, `verification_percent`
and progress checks, and data.toml's `seq_len` against `max_seq_len` and its directory; it
returns errors and warnings. String limits are enforced at load time, not here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from psyche_common.config.coordinator_rules import coordinator_config_problem
from psyche_common.config.data_location import BUILTIN_DATASETS, ServerData
from psyche_common.config.data_server import DataServerConfig
from psyche_common.config.errors import ConfigError, ConfigProblem
from psyche_common.config.lr_rules import lr_schedule_problems
from psyche_common.config.model_rules import model_problems
from psyche_common.config.state_file import StateFile
from psyche_common.config.support_rules import support_problems

__all__ = [
    "BUILTIN_DATASETS",
    "ValidationReport",
    "check_state",
    "data_dir_problem",
    "require_data_dir",
    "validate_state",
]

_LLM = "model.LLM"


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
    cfg = state.config

    first_config_problem = coordinator_config_problem(cfg)
    if first_config_problem is not None:
        errors.append(first_config_problem)
    if not state.run_id:
        errors.append(ConfigProblem("run_id", "run_id must not be empty", "RunId"))
    if cfg.verification_percent > 100:
        errors.append(
            ConfigProblem(
                "config.verification_percent",
                f"config.verification_percent ({cfg.verification_percent}) must be at most 100",
                "VerificationPercent",
            )
        )

    model_errors, model_warnings = model_problems(state)
    errors.extend(model_errors)
    if state.progress.step == 0:
        errors.append(
            ConfigProblem(
                "progress.step", "progress.step must be at least 1 (steps count from 1)", "Progress"
            )
        )
    warnings.extend(model_warnings)
    for rule in (lr_schedule_problems, support_problems):
        rule_errors, rule_warnings = rule(state)
        errors.extend(rule_errors)
        warnings.extend(rule_warnings)
    _check_data_config(state, data_config, report)
    return report


def _check_data_config(
    state: StateFile, data_config: DataServerConfig | None, report: ValidationReport
) -> None:
    uses_server = isinstance(state.model.data_location, ServerData)
    if data_config is None:
        if uses_server:
            report.warnings.append(
                ConfigProblem(
                    "data_config",
                    f"{_LLM}.data_location is a data Server: `psyche-server run` needs "
                    "--data-config data.toml to serve it",
                    "DataConfig",
                )
            )
        return
    if not uses_server:
        report.warnings.append(
            ConfigProblem(
                "data_config",
                f"a data.toml was given but {_LLM}.data_location is "
                f"{state.model.data_location.kind}, not Server: it will not be used",
                "DataConfig",
            )
        )
    if data_config.seq_len != state.model.max_seq_len:
        report.errors.append(
            ConfigProblem(
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
        return ConfigProblem("data.dir", f"data.toml dir {directory} does not exist", "DataDir")
    if not directory.is_dir():
        return ConfigProblem("data.dir", f"data.toml dir {directory} is not a directory", "DataDir")
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
