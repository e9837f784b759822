"""`psyche-local-testnet`: click group with the `start` command (its options: `flags.START_FLAGS`)."""

from __future__ import annotations

import click
from psyche_common.flag_table import options

from psyche_local_testnet.flags import START_FLAGS, start_options
from psyche_local_testnet.testnet import Testnet, TestnetError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Run a Psyche server and N clients on this machine, in tmux."""


@main.command()
@options(START_FLAGS, from_environment=False)
def start(**values: object) -> None:
    """Start the server and --num-clients clients in tmux; the summary is the last line."""
    try:
        chosen = start_options(values)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        code = Testnet(chosen, echo=click.echo).run()
    except (TestnetError, ValueError, FileNotFoundError) as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    raise SystemExit(code)
