"""`psyche-local-testnet`: click group with the `start` command."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
from psyche_common.bool_flag import bool_flag

from psyche_local_testnet.commands import ClientMetrics
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
@click.option(
    "--num-clients",
    type=click.IntRange(1),
    required=True,
    help="number of clients to start, each in its own tmux pane with its own identity",
)
@click.option(
    "--config-path",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="directory with state.toml (and optional data.toml); default: the embedded demo run",
)
@click.option(
    "--server-port",
    type=click.IntRange(1, 65534),
    default=20000,
    show_default=True,
    help="TCP port the coordinator server listens on; the clients connect to 127.0.0.1:PORT. "
    "It must be free (the server's relay shares it).",
)
@bool_flag(
    "--tui",
    default=True,
    show_default=True,
    help="show the server and client dashboards in tmux (--tui false or --no-tui: JSON log lines)",
)
@click.option(
    "--random-kill-num",
    type=click.IntRange(1),
    default=None,
    help="kill this many random clients every --random-kill-interval and restart them (default: no kills)",
)
@click.option(
    "--random-kill-interval",
    type=click.FloatRange(min=0.1),
    default=120.0,
    show_default=True,
    help="seconds between two rounds of random kills",
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
    help="signal sent to killed clients: INT = graceful stop (like Ctrl-C), TERM = terminate, "
    "KILL = crash",
)
@click.option(
    "--kill-server-at",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="SIGKILL the server once, this many seconds after the start, and restart it in its "
    "pane from RUN_DIR/saved-states/{run_id}-latest.toml on the same port (the clients "
    "reconnect); with random kills, at the first round of client kills due at or after then, "
    "before its victims. Must come before --duration's end when headless",
)
@click.option(
    "--log",
    "log_level",
    default="info",
    show_default=True,
    help="the server's --log-level (debug, info, warning, error)",
)
@click.option(
    "--write-log",
    is_flag=True,
    help="the server also logs to RUN_DIR/logs/server.log when attached (clients always log "
    "there, and headless runs always keep the server's log)",
)
@click.option(
    "--first-client-checkpoint",
    default=None,
    metavar="REPO",
    help="client 1 saves a checkpoint every epoch and uploads it to this Hugging Face repo",
)
@click.option(
    "--wandb-project",
    envvar="WANDB_PROJECT",
    default=None,
    help="every client logs its metrics (loss, learning rate, tokens/s, P2P bytes, results "
    "applied, optimizer statistics) to this Weights & Biases project (the clients' "
    "--wandb-project). Online they need WANDB_API_KEY or `wandb login`; WANDB_MODE=offline "
    "keeps the runs on disk (docs/operations.md)",
)
@click.option(
    "--wandb-run",
    envvar="WANDB_RUN",
    default=None,
    help="with --wandb-project: client N's wandb run is named RUN-N (default: each client's "
    "RUN_ID-<short id>)",
)
@click.option(
    "--wandb-group",
    envvar="WANDB_GROUP",
    default=None,
    help="with --wandb-project: the clients' wandb group (e.g. one per testnet)",
)
@click.option(
    "--wandb-entity",
    envvar="WANDB_ENTITY",
    default=None,
    help="with --wandb-project: the wandb user or team that owns the project",
)
@click.option(
    "--optim-stats-steps",
    envvar="OPTIM_STATS_STEPS",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="every client measures its DisTrO optimizer every N steps (per parameter: gradient "
    "and momentum energy, the tile energy top-k keeps, index overlap of the results applied) "
    "and logs it, to wandb too with --wandb-project; 0: never",
)
@click.option(
    "--eval-tasks",
    default=None,
    metavar="TASKS",
    help="every client evaluates these comma-separated lm-eval tasks on its live model while "
    "it would otherwise wait (the clients' --eval-tasks; task data read locally: "
    'docs/client.md, "Evals")',
)
@click.option(
    "--eval-tasks-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="with --eval-tasks: a folder of lm-eval task YAML files the clients read",
)
@click.option(
    "--eval-fewshot",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="with --eval-tasks: few-shot examples per eval prompt",
)
@click.option(
    "--eval-task-max-docs",
    type=click.IntRange(1),
    default=None,
    help="with --eval-tasks: documents of each task evaluated (default: all)",
)
@click.option(
    "--eval-heldout-every",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="every client measures the loss on the data's held-out split every N steps (0: never)",
)
@click.option(
    "--headless",
    is_flag=True,
    help="do not attach to tmux; stop after --duration or when the run ends",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0),
    default=None,
    help="with --headless: stop after this many seconds (default: at the run's end)",
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="the clients' --device: auto, cpu, cuda or cuda:N",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="where the config, logs and checkpoints go (default: ./local-testnet-runs/<time>)",
)
@click.option(
    "--startup-timeout",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="seconds to wait for the server to accept connections before giving up",
)
@click.option(
    "--server-command",
    callback=_program,
    default=None,
    hidden=True,
    help="testing: the server program (shell words) instead of psyche-server",
)
@click.option(
    "--client-command",
    callback=_program,
    default=None,
    hidden=True,
    help="testing: the client program (shell words) instead of psyche-client",
)
def start(
    num_clients: int,
    config_path: Path | None,
    server_port: int,
    tui: bool,
    random_kill_num: int | None,
    random_kill_interval: float,
    allowed_to_kill: list[int],
    kill_signal: str,
    kill_server_at: float | None,
    log_level: str,
    write_log: bool,
    first_client_checkpoint: str | None,
    wandb_project: str | None,
    wandb_run: str | None,
    wandb_group: str | None,
    wandb_entity: str | None,
    optim_stats_steps: int,
    eval_tasks: str | None,
    eval_tasks_dir: Path | None,
    eval_fewshot: int,
    eval_task_max_docs: int | None,
    eval_heldout_every: int,
    headless: bool,
    duration: float | None,
    device: str,
    run_dir: Path | None,
    startup_timeout: float,
    server_command: list[str] | None,
    client_command: list[str] | None,
) -> None:
    """Start the server and --num-clients clients in tmux; the summary is the last line."""
    try:
        metrics = ClientMetrics(
            wandb_project,
            wandb_run,
            wandb_group,
            wandb_entity,
            optim_stats_steps,
            eval_tasks,
            eval_tasks_dir.resolve() if eval_tasks_dir is not None else None,
            eval_fewshot,
            eval_task_max_docs,
            eval_heldout_every,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    options = TestnetOptions(
        num_clients=num_clients,
        config_path=config_path,
        server_port=server_port,
        tui=tui,
        random_kill_num=random_kill_num,
        random_kill_interval=random_kill_interval,
        allowed_to_kill=allowed_to_kill,
        kill_signal=kill_signal,
        kill_server_at=kill_server_at,
        log_level=log_level,
        write_log=write_log,
        first_client_checkpoint=first_client_checkpoint,
        metrics=metrics,
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
