"""Every option of `psyche-local-testnet start`, written once (a `psyche_common.flag_table`):
its flag, click type, default and help, and the field of `TestnetOptions` it sets (`target`:
"server_port", or "metrics.wandb_project" for the flags every client is started with).

The defaults are `TestnetOptions`' and `ClientMetrics`' own, read from them; `start_options`
fills the options from the parsed values (tests/unit/test_local_testnet_flags.py checks the
table against the fields). Only the wandb and `--optim-stats-steps` options are also read from
the environment (`WANDB_PROJECT`, ...), under the names the clients' own flags have there.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

import click
from psyche_common.flag_table import Flag, default_of, section_values, with_flags

from psyche_local_testnet.commands import ClientMetrics
from psyche_local_testnet.kills import KILL_SIGNALS
from psyche_local_testnet.testnet import TestnetOptions


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


def _resolved(value: object) -> object:
    return Path(str(value)).resolve()


def _testnet(name: str) -> object:
    return default_of(TestnetOptions, name)


def _metrics(name: str) -> object:
    return default_of(ClientMetrics, name)


START_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--num-clients",
        "number of clients to start, each in its own tmux pane with its own identity",
        "num_clients",
        type=click.IntRange(1),
        required=True,
    ),
    Flag(
        "--config-path",
        "directory with state.toml (and optional data.toml); default: the embedded demo run",
        "config_path",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
    ),
    Flag(
        "--server-port",
        "TCP port the coordinator server listens on; the clients connect to 127.0.0.1:PORT. "
        "It must be free (the server's relay shares it).",
        "server_port",
        _testnet("server_port"),
        click.IntRange(1, 65534),
        show_default=True,
    ),
    Flag(
        "--tui",
        "show the server and client dashboards in tmux (--tui false or --no-tui: JSON log lines)",
        "tui",
        _testnet("tui"),
        is_flag=True,
        show_default=True,
    ),
    Flag(
        "--random-kill-num",
        "kill this many random clients every --random-kill-interval and restart them "
        "(default: no kills)",
        "random_kill_num",
        type=click.IntRange(1),
    ),
    Flag(
        "--random-kill-interval",
        "seconds between two rounds of random kills",
        "random_kill_interval",
        _testnet("random_kill_interval"),
        click.FloatRange(min=0.1),
        show_default=True,
    ),
    Flag(
        "--allowed-to-kill",
        "comma list of 1-based client numbers that may be killed (default: all)",
        "allowed_to_kill",
        callback=_client_numbers,
    ),
    Flag(
        "--kill-signal",
        "signal sent to killed clients: INT = graceful stop (like Ctrl-C), TERM = terminate, "
        "KILL = crash",
        "kill_signal",
        _testnet("kill_signal"),
        click.Choice(sorted(KILL_SIGNALS)),
        show_default=True,
    ),
    Flag(
        "--kill-server-at",
        "SIGKILL the server once, this many seconds after the start, and restart it in its "
        "pane from RUN_DIR/saved-states/{run_id}-latest.toml on the same port (the clients "
        "reconnect); with random kills, at the first round of client kills due at or after "
        "then, before its victims. Must come before --duration's end when headless",
        "kill_server_at",
        type=click.FloatRange(min=0, min_open=True),
        metavar="SECONDS",
    ),
    Flag(
        "--log",
        "the server's --log-level (debug, info, warning, error)",
        "log_level",
        _testnet("log_level"),
        show_default=True,
        dest="log_level",
    ),
    Flag(
        "--write-log",
        "the server also logs to RUN_DIR/logs/server.log when attached (clients always log "
        "there, and headless runs always keep the server's log)",
        "write_log",
        switch=True,
    ),
    Flag(
        "--first-client-checkpoint",
        "client 1 saves a checkpoint every epoch and uploads it to this Hugging Face repo",
        "first_client_checkpoint",
        metavar="REPO",
    ),
    Flag(
        "--wandb-project",
        "every client logs its metrics (loss, learning rate, tokens/s, P2P bytes, results "
        "applied, optimizer statistics) to this Weights & Biases project (the clients' "
        "--wandb-project). Online they need WANDB_API_KEY or `wandb login`; WANDB_MODE=offline "
        "keeps the runs on disk (docs/operations.md)",
        "metrics.wandb_project",
        env="WANDB_PROJECT",
    ),
    Flag(
        "--wandb-run",
        "with --wandb-project: client N's wandb run is named RUN-N (default: each client's "
        "RUN_ID-<short id>)",
        "metrics.wandb_run",
        env="WANDB_RUN",
    ),
    Flag(
        "--wandb-group",
        "with --wandb-project: the clients' wandb group (e.g. one per testnet)",
        "metrics.wandb_group",
        env="WANDB_GROUP",
    ),
    Flag(
        "--wandb-entity",
        "with --wandb-project: the wandb user or team that owns the project",
        "metrics.wandb_entity",
        env="WANDB_ENTITY",
    ),
    Flag(
        "--optim-stats-steps",
        "every client measures its DisTrO optimizer every N steps (per parameter: gradient "
        "and momentum energy, the tile energy top-k keeps, index overlap of the results "
        "applied) and logs it, to wandb too with --wandb-project; 0: never",
        "metrics.optim_stats_steps",
        _metrics("optim_stats_steps"),
        click.IntRange(0),
        show_default=True,
        env="OPTIM_STATS_STEPS",
    ),
    Flag(
        "--eval-tasks",
        "every client evaluates these comma-separated lm-eval tasks on its live model while "
        "it would otherwise wait (the clients' --eval-tasks; task data read locally: "
        'docs/client.md, "Evals")',
        "metrics.eval_tasks",
        metavar="TASKS",
    ),
    Flag(
        "--eval-tasks-dir",
        "with --eval-tasks: a folder of lm-eval task YAML files the clients read",
        "metrics.eval_tasks_dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        convert=_resolved,
    ),
    Flag(
        "--eval-fewshot",
        "with --eval-tasks: few-shot examples per eval prompt",
        "metrics.eval_fewshot",
        _metrics("eval_fewshot"),
        click.IntRange(0),
        show_default=True,
    ),
    Flag(
        "--eval-task-max-docs",
        "with --eval-tasks: documents of each task evaluated (default: all)",
        "metrics.eval_task_max_docs",
        type=click.IntRange(1),
    ),
    Flag(
        "--eval-heldout-every",
        "every client measures the loss on the data's held-out split every N steps (0: never)",
        "metrics.eval_heldout_every",
        _metrics("eval_heldout_every"),
        click.IntRange(0),
        show_default=True,
    ),
    Flag(
        "--headless",
        "do not attach to tmux; stop after --duration or when the run ends",
        "headless",
        switch=True,
    ),
    Flag(
        "--duration",
        "with --headless: stop after this many seconds (default: at the run's end)",
        "duration",
        type=click.FloatRange(min=0),
    ),
    Flag(
        "--device",
        "the clients' --device: auto, cpu, cuda or cuda:N",
        "device",
        _testnet("device"),
        show_default=True,
    ),
    Flag(
        "--run-dir",
        "where the config, logs and checkpoints go (default: ./local-testnet-runs/<time>)",
        "run_dir",
        type=click.Path(file_okay=False, path_type=Path),
    ),
    Flag(
        "--startup-timeout",
        "seconds to wait for the server to accept connections before giving up",
        "startup_timeout",
        _testnet("startup_timeout"),
        click.FloatRange(min=1),
        show_default=True,
    ),
    Flag(
        "--server-command",
        "testing: the server program (shell words) instead of psyche-server",
        "server_program",
        callback=_program,
        hidden=True,
    ),
    Flag(
        "--client-command",
        "testing: the client program (shell words) instead of psyche-client",
        "client_program",
        callback=_program,
        hidden=True,
    ),
)


def start_options(values: Mapping[str, object]) -> TestnetOptions:
    """The `TestnetOptions` of `start`'s parsed values (by Python name; a missing one takes
    its default). Flags that do not go together raise ValueError naming them."""
    metrics = with_flags(ClientMetrics(), START_FLAGS, "metrics", values)
    return TestnetOptions(**section_values(START_FLAGS, "", values), metrics=metrics)  # type: ignore[arg-type]
