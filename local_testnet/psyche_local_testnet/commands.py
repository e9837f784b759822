"""Command lines of the processes a testnet starts (pure: argv lists and environments).

Contract of the programs:
  psyche-server validate-config --state STATE [--data-config DATA]
  psyche-server run --state STATE --server-port PORT --tui|--no-tui [--data-config DATA]
                    --log-level LEVEL [--log-format json --log-file FILE] [--save-state-dir DIR]
                    [--identity-secret-key-path FILE] [--checkpointer KEY]
    with --save-state-dir, the server keeps DIR/{run_id}-latest.toml at the run's resume point
    (a state file `run --state` accepts; its [progress] step is the step it resumes at);
  psyche-client train --server-addr 127.0.0.1:PORT --run-id ID --device DEV
                      --logs tui|json [--write-log FILE] [--checkpoint-dir D --hub-repo R]
                      [--server-key HEX]
                      [--wandb-project P [--wandb-run R-N] [--wandb-group G]
                       [--wandb-entity E]] [--optim-stats-steps S]
                      [--eval-tasks T [--eval-tasks-dir D] [--eval-fewshot F]
                       [--eval-task-max-docs M]] [--eval-heldout-every H]
  with RAW_IDENTITY_SECRET_KEY=<64 hex chars> in the client's environment.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from psyche_common.protocol import Identity

from psyche_local_testnet.identities import (
    IDENTITY_ENV,
    client_public_hex,
    client_secret_hex,
    server_secret_key,
)

CHECKPOINTING_CLIENT = 1
"""The client that saves and uploads checkpoints with --first-client-checkpoint."""


def latest_state_name(run_id: str) -> str:
    """The name of the server's `{run_id}-latest.toml`, with the characters the server replaces
    in a run id (any but letters, digits and `-_.`) replaced by `_` as it does."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)
    return f"{safe}-latest.toml"


def default_program(name: str) -> list[str]:
    """The console script `name` next to this Python, else on PATH."""
    sibling = Path(sys.executable).parent / name
    if sibling.is_file():
        return [str(sibling)]
    found = shutil.which(name)
    if found:
        return [found]
    raise FileNotFoundError(f"cannot find the {name} program (is the project installed?)")


@dataclass(frozen=True)
class ProcessSpec:
    """One process to run in a pane."""

    argv: list[str]
    env: Mapping[str, str] = field(default_factory=dict)

    def shell_command(self) -> str:
        """A `sh -c` command line that replaces the shell with the program (so the pane's pid
        is the program's pid and signals reach it directly)."""
        env = [f"{key}={value}" for key, value in sorted(self.env.items())]
        return "exec " + shlex.join(["env", *env, *self.argv])


@dataclass(frozen=True)
class ClientMetrics:
    """The metrics and eval flags every client is started with (`psyche-client train`'s)."""

    wandb_project: str | None = None
    wandb_run: str | None = None
    """A prefix: client N's run is `{wandb_run}-{N}` (default: the client's own name)."""
    wandb_group: str | None = None
    wandb_entity: str | None = None
    optim_stats_steps: int = 0
    eval_tasks: str | None = None
    eval_tasks_dir: Path | None = None
    eval_fewshot: int = 0
    eval_task_max_docs: int | None = None
    eval_heldout_every: int = 0

    def __post_init__(self) -> None:
        if self.wandb_project is None:
            given = [
                f"--wandb-{name}"
                for name, value in (
                    ("run", self.wandb_run),
                    ("group", self.wandb_group),
                    ("entity", self.wandb_entity),
                )
                if value
            ]
            if given:
                raise ValueError(f"{', '.join(given)} needs --wandb-project")
        if self.optim_stats_steps < 0:
            raise ValueError(f"--optim-stats-steps must be >= 0, got {self.optim_stats_steps}")
        if not self.eval_tasks:
            given = [
                flag
                for flag, value in (
                    ("--eval-tasks-dir", self.eval_tasks_dir),
                    ("--eval-fewshot", self.eval_fewshot),
                    ("--eval-task-max-docs", self.eval_task_max_docs),
                )
                if value
            ]
            if given:
                raise ValueError(f"{', '.join(given)} needs --eval-tasks")

    def argv(self, client_number: int) -> list[str]:
        argv: list[str] = []
        if self.wandb_project:
            argv += ["--wandb-project", self.wandb_project]
        if self.wandb_run:
            argv += ["--wandb-run", f"{self.wandb_run}-{client_number}"]
        if self.wandb_group:
            argv += ["--wandb-group", self.wandb_group]
        if self.wandb_entity:
            argv += ["--wandb-entity", self.wandb_entity]
        if self.optim_stats_steps:
            argv += ["--optim-stats-steps", str(self.optim_stats_steps)]
        if self.eval_tasks:
            argv += ["--eval-tasks", self.eval_tasks]
            if self.eval_tasks_dir is not None:
                argv += ["--eval-tasks-dir", str(self.eval_tasks_dir)]
            if self.eval_fewshot:
                argv += ["--eval-fewshot", str(self.eval_fewshot)]
            if self.eval_task_max_docs is not None:
                argv += ["--eval-task-max-docs", str(self.eval_task_max_docs)]
        if self.eval_heldout_every:
            argv += ["--eval-heldout-every", str(self.eval_heldout_every)]
        return argv


@dataclass(frozen=True)
class TestnetCommands:
    """Builds the server, validation and client commands of one testnet."""

    server_program: Sequence[str]
    client_program: Sequence[str]
    state_path: Path
    data_config_path: Path | None
    server_port: int
    run_id: str
    session: str
    log_dir: Path | None
    server_log_file: bool = True  # the server also logs to log_dir/server.log
    log_level: str = "info"
    tui: bool = False
    device: str = "cpu"
    first_client_checkpoint: str | None = None
    checkpoint_dir: Path | None = None
    save_state_dir: Path | None = None  # the server's --save-state-dir (needed to restart it)
    server_key_path: Path | None = None
    """The server's key file (`--identity-secret-key-path`), holding `server_secret_key`;
    the clients then pass its public key as `--server-key`."""
    metrics: ClientMetrics = field(default_factory=ClientMetrics)

    def validate(self) -> list[str]:
        argv = [*self.server_program, "validate-config", "--state", str(self.state_path)]
        if self.data_config_path is not None:
            argv += ["--data-config", str(self.data_config_path)]
        return argv

    def latest_state_path(self) -> Path | None:
        """The file the server keeps at the run's resume point (None without a save dir)."""
        if self.save_state_dir is None:
            return None
        return self.save_state_dir / latest_state_name(self.run_id)

    def server(self, state_path: Path | None = None) -> ProcessSpec:
        """The server; `state_path` replaces the run's state file (a restart resumes from
        `latest_state_path()`)."""
        argv = [
            *self.server_program,
            "run",
            "--state",
            str(state_path or self.state_path),
            "--server-port",
            str(self.server_port),
            "--tui" if self.tui else "--no-tui",
            "--log-level",
            self.log_level,
        ]
        if self.data_config_path is not None:
            argv += ["--data-config", str(self.data_config_path)]
        if not self.tui:
            argv += ["--log-format", "json"]
        if self.log_dir is not None and self.server_log_file:
            argv += ["--log-file", str(self.log_dir / "server.log")]
        if self.save_state_dir is not None:
            argv += ["--save-state-dir", str(self.save_state_dir)]
        if self.server_key_path is not None:
            argv += ["--identity-secret-key-path", str(self.server_key_path)]
        if self.first_client_checkpoint:  # the server accepts its uploads' Checkpoint reports
            argv += ["--checkpointer", client_public_hex(self.session, CHECKPOINTING_CLIENT)]
        return ProcessSpec(argv)

    def server_public_key(self) -> bytes:
        """The public key of the server's identity in this session."""
        return Identity.from_secret_bytes(server_secret_key(self.session)).public_key

    def write_server_key(self) -> None:
        """Write the server's key file (mode 0600), when the testnet uses one."""
        if self.server_key_path is not None:
            Identity.from_secret_bytes(server_secret_key(self.session)).save(self.server_key_path)

    def client(self, client_number: int, log_file: Path | None) -> ProcessSpec:
        argv = [
            *self.client_program,
            "train",
            "--server-addr",
            f"127.0.0.1:{self.server_port}",
            "--run-id",
            self.run_id,
            "--device",
            self.device,
            "--logs",
            "tui" if self.tui else "json",
        ]
        if log_file is not None:
            argv += ["--write-log", str(log_file)]
        if client_number == CHECKPOINTING_CLIENT and self.first_client_checkpoint:
            checkpoint_dir = self.checkpoint_dir or Path("checkpoints")
            argv += [
                "--checkpoint-dir",
                str(checkpoint_dir),
                "--hub-repo",
                self.first_client_checkpoint,
            ]
        if self.server_key_path is not None:
            argv += ["--server-key", self.server_public_key().hex()]
        argv += self.metrics.argv(client_number)
        env = {IDENTITY_ENV: client_secret_hex(self.session, client_number)}
        return ProcessSpec(argv, env)
