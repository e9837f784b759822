"""Crash the testnet's server and start it again from its saved state (`--kill-server-at`).

The server runs with `--save-state-dir`, so it keeps `{run_id}-latest.toml` at the run's resume
point. A restart SIGKILLs the server pane's process group, waits for it to exit, saves the
killed server's output (`logs/server.N.pane.txt`, N counting restarts from 0), respawns the same
pane with the same command on that file (same port, same save directory, same log file) and
waits until the new server accepts connections. Respawning clears a pane's screen, so the new
pane first prints the saved output: the killed server's output stays above the new server's.
The clients, still running, reconnect by themselves (`psyche-client train
--server-reconnect-timeout`, 600 s by default).
"""

from __future__ import annotations

import shlex
import signal
import tomllib
from pathlib import Path

from psyche_local_testnet.commands import TestnetCommands
from psyche_local_testnet.lifecycle import ServerStartError, wait_for_port
from psyche_local_testnet.tmux_session import TmuxTestnetSession

SERVER_EXIT_TIMEOUT = 30.0


class ServerRestartError(RuntimeError):
    """The server could not be restarted; the message says why."""


def read_resume_step(path: Path) -> int:
    """The step a saved state file resumes at: its `[progress] step` (1 when absent, as for
    the server)."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ServerRestartError(f"cannot read the saved state {path}: {exc}") from exc
    progress = document.get("progress", {})
    step = progress.get("step", 1) if isinstance(progress, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ServerRestartError(f"the saved state {path} has no valid [progress] step")
    return step


def kill_and_restart_server(
    tmux: TmuxTestnetSession,
    pane_id: str,
    commands: TestnetCommands,
    startup_timeout: float,
    killed_output: Path,
) -> tuple[Path, int]:
    """SIGKILL the server in `pane_id`, write its output to `killed_output`, restart it there
    from its latest saved state and wait for its port; returns the state file and the step it
    resumes at."""
    latest = commands.latest_state_path()
    if latest is None:
        raise ServerRestartError("the server runs without --save-state-dir: nothing to resume")
    pid = tmux.send_signal(pane_id, signal.SIGKILL)
    if pid is not None:
        tmux.await_exit(pane_id, pid, SERVER_EXIT_TIMEOUT)
    if not latest.is_file():
        raise ServerRestartError(f"the server saved no state to resume from ({latest} is missing)")
    step = read_resume_step(latest)
    killed_output.parent.mkdir(parents=True, exist_ok=True)
    killed_output.write_text(tmux.capture(pane_id) + "\n", encoding="utf-8")
    tmux.clear_history(pane_id)
    replay = f"cat {shlex.quote(str(killed_output))}; "
    tmux.respawn(pane_id, replay + commands.server(latest).shell_command())
    try:
        wait_for_port(commands.server_port, startup_timeout, lambda: not tmux.status(pane_id).dead)
    except ServerStartError as exc:
        raise ServerRestartError(f"the restarted server did not start: {exc}") from None
    return latest, step
