"""`psyche-server`: the click group of the server's commands.

This module creates the group and its `validate-config` command. Other commands (`run`) are added
with `@main.command(...)` here or `main.add_command(...)` from their own module.
"""

from __future__ import annotations

from pathlib import Path

import click
from psyche_common.config import ConfigError, summary_lines
from psyche_common.flag_table import options

from .flags import VALIDATE_FLAGS
from .run_files import load_run


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Psyche coordinator server (centralized architecture)."""


@main.command("validate-config")
@options(VALIDATE_FLAGS, from_environment=False)
def validate_config(state_path: Path, data_config_path: Path | None, run_id: str | None) -> None:
    """Check a state.toml (and data.toml) without starting anything, as `run` checks them.

    Exits 0 and prints a summary when the configuration can run, 1 with every error on stderr.
    Warnings (on stderr) include a run that needs more samples than its data holds, when the
    data can be sized here (the data server's data.toml, a Local directory).
    """
    try:
        loaded = load_run(state_path, data_config_path, run_id=run_id)
    except ConfigError as exc:
        click.echo(f"Error found in config: {exc}", err=True)
        raise SystemExit(1) from None
    for warning in loaded.report.warnings:
        click.echo(f"warning: {warning}", err=True)
    error = loaded.error()
    if error is not None:
        click.echo(f"Error found in config: {error}", err=True)
        raise SystemExit(1)
    click.echo("Configs are OK!")
    for line in summary_lines(loaded.state, loaded.data_config):
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
