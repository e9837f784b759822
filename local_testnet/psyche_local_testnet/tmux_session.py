"""tmux side of the testnet: a private tmux server (own socket) holding one pane per process.

A testnet never touches the user's own tmux: it runs a tmux server on a socket named after the
testnet, with `remain-on-exit` on (a dead pane stays visible with its exit status and can be
respawned), pane titles on the borders, and a tiled layout of at most `PANES_PER_WINDOW` panes
per window, so any number of clients fits. Each pane runs its program via `exec`, so the pane's
pid is the program's pid and the leader of its own process group: signals and the final
clean-up reach the program and anything it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import libtmux

PANES_PER_WINDOW = 6
WINDOW_SIZE = (240, 70)
TMUX_CONFIG = """\
set -g remain-on-exit on
set -g history-limit 50000
set -g mouse on
set -g pane-border-status top
set -g pane-border-format " #{pane_title} "
set -g allow-rename off
"""


class TmuxError(RuntimeError):
    """A tmux command failed; the message has tmux's error output."""


@dataclass(frozen=True)
class PaneStatus:
    dead: bool
    pid: int | None
    exit_status: int | None


class TmuxTestnetSession:
    """A private tmux server with one session; panes are addressed by their tmux pane id."""

    def __init__(self, socket_name: str, session_name: str, config_dir: Path) -> None:
        self.socket_name = socket_name
        self.session_name = session_name
        config_dir.mkdir(parents=True, exist_ok=True)
        self._config_file = config_dir / "tmux.conf"
        self._config_file.write_text(TMUX_CONFIG, encoding="utf-8")
        self._server = libtmux.Server(socket_name=socket_name, config_file=str(self._config_file))
        self._windows: list[tuple[str, list[str]]] = []  # (window id, pane ids)
        self.pids_started: set[int] = set()

    # ------------------------------------------------------------ low level

    def _tmux(self, *args: str) -> list[str]:
        result = self._server.cmd(*args)
        if result.returncode not in (0, None) or (result.stderr and not result.stdout):
            raise TmuxError(f"tmux {' '.join(args[:2])} failed: {' '.join(result.stderr)}")
        return list(result.stdout)

    def _remember_pid(self, pane_id: str) -> None:
        status = self.status(pane_id)
        if status.pid is not None:
            self.pids_started.add(status.pid)

    def _open_window(self, *create: str, command: str) -> str:
        """Run a tmux command that creates a window (`new-session`, `new-window`) running
        `command`; record the window and return its pane id."""
        out = self._tmux(*create, "-P", "-F", "#{window_id} #{pane_id}", command)
        window_id, pane_id = out[0].split()
        self._windows.append((window_id, [pane_id]))
        return pane_id

    def _titled(self, pane_id: str, title: str) -> str:
        self._tmux("select-pane", "-t", pane_id, "-T", title)
        self._remember_pid(pane_id)
        return pane_id

    # ------------------------------------------------------------ panes

    def start(self, command: str, title: str) -> str:
        """Create the session; its first pane runs `command`. Returns the pane id."""
        width, height = WINDOW_SIZE
        pane_id = self._open_window(
            "new-session",
            "-d",
            "-s",
            self.session_name,
            "-n",
            "testnet",
            "-x",
            str(width),
            "-y",
            str(height),
            command=command,
        )
        return self._titled(pane_id, title)

    def add_pane(self, command: str, title: str) -> str:
        """Run `command` in a new pane (a new window when the last one is full)."""
        if not self._windows:
            raise TmuxError("the tmux session has not been started")
        window_id, panes = self._windows[-1]
        if len(panes) >= PANES_PER_WINDOW:
            pane_id = self._open_window(
                "new-window",
                "-d",
                "-t",
                self.session_name,
                "-n",
                f"clients-{len(self._windows)}",
                command=command,
            )
        else:
            out = self._tmux(
                "split-window", "-d", "-t", window_id, "-P", "-F", "#{pane_id}", command
            )
            pane_id = out[0].strip()
            panes.append(pane_id)
            self._tmux("select-layout", "-t", window_id, "tiled")
        return self._titled(pane_id, title)

    def status(self, pane_id: str) -> PaneStatus:
        out = self._tmux(
            "display-message", "-p", "-t", pane_id, "#{pane_dead} #{pane_pid} #{pane_dead_status}"
        )
        parts = (out[0] if out else "").split()
        dead = bool(parts) and parts[0] == "1"
        pid = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        exit_status = int(parts[2]) if len(parts) > 2 and parts[2].lstrip("-").isdigit() else None
        return PaneStatus(dead=dead, pid=pid, exit_status=exit_status)

    def send_signal(self, pane_id: str, sig: signal.Signals) -> int | None:
        """Send `sig` to the pane's process group; returns its pid, None if nothing runs there."""
        status = self.status(pane_id)
        if status.dead or status.pid is None:
            return None
        return status.pid if _signal_group(status.pid, sig) else None

    def wait_dead(self, pane_id: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.status(pane_id).dead:
                return True
            time.sleep(0.1)
        return self.status(pane_id).dead

    def await_exit(self, pane_id: str, pid: int, grace: float) -> None:
        """Wait for a signalled pane program to exit; SIGKILL it after `grace` seconds, then
        SIGKILL whatever is left of its process group."""
        if not self.wait_dead(pane_id, grace):
            _signal_group(pid, signal.SIGKILL)
            self.wait_dead(pane_id, 5.0)
        _kill_group_leftovers(pid)

    def respawn(self, pane_id: str, command: str) -> None:
        self._tmux("respawn-pane", "-k", "-t", pane_id, command)
        self._remember_pid(pane_id)

    def clear_history(self, pane_id: str) -> None:
        self._tmux("clear-history", "-t", pane_id)

    def capture(self, pane_id: str) -> str:
        return "\n".join(self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", pane_id))

    def all_panes(self) -> list[str]:
        return [pane for _, panes in self._windows for pane in panes]

    # ------------------------------------------------------------ session

    def attach_argv(self) -> list[str]:
        return ["tmux", "-L", self.socket_name, "attach-session", "-t", self.session_name]

    def attach(self) -> subprocess.Popen[bytes]:
        # A private socket, so attaching from inside another tmux is not nesting the same server.
        env = {k: v for k, v in os.environ.items() if k != "TMUX"}
        return subprocess.Popen(self.attach_argv(), env=env)

    def close(self, sig: signal.Signals = signal.SIGINT, grace: float = 10.0) -> None:
        """Stop every pane's program (signal, wait, then SIGKILL) and end the tmux server."""
        panes = self.all_panes()
        live: list[tuple[str, int]] = []
        for pane_id in panes:
            try:
                status = self.status(pane_id)
            except TmuxError:
                continue
            if not status.dead and status.pid is not None:
                _signal_group(status.pid, sig)
                live.append((pane_id, status.pid))
        deadline = time.monotonic() + grace
        for _pane_id, pid in live:
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                _signal_group(pid, signal.SIGKILL)
            _kill_group_leftovers(pid)
        socket_path = self._socket_path()
        with contextlib.suppress(Exception):  # the server may already be gone
            self._server.cmd("kill-server")
        if socket_path is not None:  # tmux leaves its socket file behind
            with contextlib.suppress(OSError):
                socket_path.unlink()

    def _socket_path(self) -> Path | None:
        try:
            out = self._tmux("display-message", "-p", "#{socket_path}")
        except Exception:
            return None
        return Path(out[0]) if out and out[0] else None


def _signal_group(pid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False


def _kill_group_leftovers(pgid: int) -> None:
    """SIGKILL what is left of a pane's process group (children of an exited program)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
