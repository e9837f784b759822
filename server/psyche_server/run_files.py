"""The one way the server reads a run's files: `load_run` loads state.toml (and data.toml once,
when given), runs every rule on them (`validate_state`, the data-supply and data-files
warnings) and builds the coordinator from them, so `validate-config` and `run` accept and
refuse the same files with the same reasons; the commands only differ in what they do with
the result (print a summary, or serve).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from psyche_common.config import (
    ConfigError,
    ConfigProblem,
    DataServerConfig,
    StateFile,
    ValidationReport,
    load_data_config,
    load_state,
    validate_state,
)
from psyche_common.coordinator import Coordinator
from psyche_common.data.supply import data_files_problem, supply_warning


@dataclass(frozen=True)
class LoadedRun:
    """A run's files, read and checked: the report's errors mean it cannot run (then
    `coordinator` is None); its warnings do not stop it."""

    state_path: Path
    state: StateFile
    data_config: DataServerConfig | None
    report: ValidationReport
    coordinator: Coordinator | None

    def error(self) -> ConfigError | None:
        """Every error of the report, naming the state file; None when the run can start."""
        return None if self.report.ok else ConfigError(self.report.errors, self.state_path)


def load_run(
    state_path: Path, data_config_path: Path | None = None, *, run_id: str | None = None
) -> LoadedRun:
    """Read and check the run's files (see the module docstring). A file that cannot be read
    or parsed raises `ConfigError` naming it and the fields at fault."""
    state = load_state(state_path, run_id=run_id)
    data_config = None if data_config_path is None else load_data_config(data_config_path)
    report = validate_state(state, data_config)
    for warning in (
        None if data_config is None else data_files_problem(data_config),
        supply_warning(state, data_config),
    ):
        if warning is not None:
            report.warnings.append(warning)
    coordinator = None
    if report.ok:
        try:
            coordinator = Coordinator.from_state_file(state)
        except ValueError as exc:  # a saved state the coordinator cannot resume from
            report.errors.append(ConfigProblem("epoch_state", str(exc)))
    return LoadedRun(Path(state_path), state, data_config, report, coordinator)
