"""`psyche-server`: the click group of the server's commands.

This module creates the group and its `validate-config` command. Other commands (`run`) are added
with `@main.command(...)` here or `main.add_command(...)` from their own module.
"""

from __future__ import annotations

from pathlib import Path

import click
from psyche_common.config import (
    ConfigError,
    DataServerConfig,
    load_data_config,
    load_state,
    summary_lines,
    validate_state,
)
from psyche_common.data.supply import data_files_problem, supply_warning

_existing_file = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Psyche coordinator server (centralized architecture)."""


@main.command("validate-config")
@click.option("--state", "state_path", type=_existing_file, required=True, help="state.toml")
@click.option(
    "--data-config",
    "data_config_path",
    type=_existing_file,
    default=None,
    help="data.toml of the TCP data server (checked against the state file)",
)
@click.option(
    "--run-id",
    default=None,
    help="run id to use instead of the file's (needed for files without run_id)",
)
def validate_config(state_path: Path, data_config_path: Path | None, run_id: str | None) -> None:
    """Check a state.toml (and data.toml) without starting anything.

    Exits 0 and prints a summary when the configuration can run, 1 with every error on stderr.
    Warnings (on stderr) include a run that needs more samples than its data holds, when the
    data can be sized here (the data server's data.toml, a Local directory).
    """
    try:
        state = load_state(state_path, run_id=run_id)
        data_config: DataServerConfig | None = None
        if data_config_path is not None:
            data_config = load_data_config(data_config_path)
    except ConfigError as exc:
        click.echo(f"Error found in config: {exc}", err=True)
        raise SystemExit(1) from None

    report = validate_state(state, data_config)
    for warning in (
        None if data_config is None else data_files_problem(data_config),
        supply_warning(state, data_config),
    ):
        if warning is not None:
            report.warnings.append(warning)
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    if not report.ok:
        click.echo(f"Error found in config: {ConfigError(report.errors, state_path)}", err=True)
        raise SystemExit(1)
    click.echo("Configs are OK!")
    for line in summary_lines(state, data_config):
        click.echo(f"  {line}")


def _register_run_command() -> None:
    from psyche_server.run_command import run

    main.add_command(run)


_register_run_command()


def _register_observe_and_help() -> None:
    """`observe` (the run's event files) and `print-all-help`."""
    from psyche_common.cli_help import print_all_help_command

    from psyche_server.observe import observe

    main.add_command(observe)
    main.add_command(print_all_help_command(main, "psyche-server"))


_register_observe_and_help()
