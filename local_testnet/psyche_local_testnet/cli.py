"""`psyche-local-testnet`: click group with the `start` command."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from psyche_local_testnet.kills import KILL_SIGNALS
from psyche_local_testnet.testnet import Testnet, TestnetError, TestnetOptions


def _client_numbers(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[int]:
    if not value:
        return []
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated client numbers, got {value!r}"
        ) from None


def _program(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[str] | None:
    return shlex.split(value) if value else None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Run a Psyche server and N clients on this machine, in tmux."""


@main.command()
@click.option("--num-clients", type=click.IntRange(1), required=True, help="clients to start")
@click.option(
    "--config-path",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="directory with state.toml (and optional data.toml); default: the embedded demo run",
)
@click.option("--server-port", type=click.IntRange(1, 65535), default=20000, show_default=True)
@click.option("--tui/--no-tui", default=True, show_default=True, help="server and client TUIs")
@click.option(
    "--random-kill-num", type=click.IntRange(1), default=None, help="clients killed per interval"
)
@click.option(
    "--random-kill-interval",
    type=click.FloatRange(min=0.1),
    default=120.0,
    show_default=True,
    help="seconds between kills",
)
@click.option(
    "--allowed-to-kill",
    callback=_client_numbers,
    default=None,
    help="comma list of 1-based client numbers that may be killed (default: all)",
)
@click.option(
    "--kill-signal",
    type=click.Choice(sorted(KILL_SIGNALS)),
    default="INT",
    show_default=True,
    help="INT = graceful stop, KILL = crash",
)
@click.option("--log", "log_level", default="info", show_default=True, help="log level")
@click.option("--write-log", is_flag=True, help="clients and server also log to RUN_DIR/logs")
@click.option(
    "--first-client-checkpoint",
    default=None,
    metavar="REPO",
    help="client 1 saves checkpoints and uploads them to this Hub repo",
)
@click.option(
    "--headless", is_flag=True, help="do not attach; stop after --duration or at the run's end"
)
@click.option(
    "--duration", type=click.FloatRange(min=0), default=None, help="seconds to run when headless"
)
@click.option("--device", default="cpu", show_default=True, help="clients' --device")
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="where the config, logs and checkpoints go (default: ./local-testnet-runs/<time>)",
)
@click.option("--startup-timeout", type=click.FloatRange(min=1), default=120.0, show_default=True)
@click.option("--server-command", callback=_program, default=None, hidden=True)
@click.option("--client-command", callback=_program, default=None, hidden=True)
def start(
    num_clients: int,
    config_path: Path | None,
    server_port: int,
    tui: bool,
    random_kill_num: int | None,
    random_kill_interval: float,
    allowed_to_kill: list[int],
    kill_signal: str,
    log_level: str,
    write_log: bool,
    first_client_checkpoint: str | None,
    headless: bool,
    duration: float | None,
    device: str,
    run_dir: Path | None,
    startup_timeout: float,
    server_command: list[str] | None,
    client_command: list[str] | None,
) -> None:
    """Start the server and NUM_CLIENTS clients in tmux; the summary is the last line."""
    options = TestnetOptions(
        num_clients=num_clients,
        config_path=config_path,
        server_port=server_port,
        tui=tui,
        random_kill_num=random_kill_num,
        random_kill_interval=random_kill_interval,
        allowed_to_kill=allowed_to_kill,
        kill_signal=kill_signal,
        log_level=log_level,
        write_log=write_log,
        first_client_checkpoint=first_client_checkpoint,
        headless=headless,
        duration=duration,
        run_dir=run_dir,
        device=device,
        startup_timeout=startup_timeout,
        server_program=server_command,
        client_program=client_command,
    )
    try:
        code = Testnet(options, echo=click.echo).run()
    except (TestnetError, ValueError, FileNotFoundError) as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    raise SystemExit(code)
