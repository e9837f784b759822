"""Runs a local testnet: validate the config, start the server and N clients in tmux, wait for
the server port, then attach (or run headless for a while), kill clients at random and crash
and restart the server once if asked, tear everything down and summarise the clients' logs.

Teardown always happens (normal end, the server exiting, Ctrl-C, SIGTERM/SIGHUP, detach from
tmux): every pane's program is signalled, waited for, then SIGKILLed, and the private tmux
server is ended, so no process is left behind.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from psyche_local_testnet.commands import ClientMetrics, TestnetCommands, default_program
from psyche_local_testnet.default_config import write_default_state
from psyche_local_testnet.kills import (
    KILL_SIGNALS,
    KillScheduler,
    ServerKillSchedule,
    check_kill_options,
    check_server_kill,
)
from psyche_local_testnet.lifecycle import (
    FinishWatcher,
    ServerStartError,
    port_in_use,
    safe_echo,
    signals_ignored,
    signals_raise_interrupt,
    wait_for_port,
)
from psyche_local_testnet.server_restart import ServerRestartError, kill_and_restart_server
from psyche_local_testnet.summary import (
    ServerRestart,
    Summary,
    log_file_name,
    read_client_logs,
    server_log_reports_finished,
    summarize,
)
from psyche_local_testnet.tmux_session import TmuxTestnetSession

TICK_SECONDS = 0.5
VICTIM_EXIT_TIMEOUT = 30.0
TEARDOWN_GRACE = 10.0


class TestnetError(RuntimeError):
    """The testnet could not start; the message says why."""


@dataclass
class TestnetOptions:
    num_clients: int
    config_path: Path | None = None
    server_port: int = 20000
    tui: bool = True
    random_kill_num: int | None = None
    random_kill_interval: float = 120.0
    allowed_to_kill: list[int] = field(default_factory=list)
    kill_signal: str = "INT"
    kill_server_at: float | None = None
    log_level: str = "info"
    write_log: bool = False
    first_client_checkpoint: str | None = None
    metrics: ClientMetrics = field(default_factory=ClientMetrics)
    headless: bool = False
    duration: float | None = None
    run_dir: Path | None = None
    device: str = "cpu"
    startup_timeout: float = 120.0
    server_program: list[str] | None = None
    client_program: list[str] | None = None


@dataclass
class _Client:
    number: int
    pane_id: str
    incarnation: int = 0


def read_run_id(state_path: Path) -> str:
    try:
        document = tomllib.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TestnetError(f"cannot read {state_path}: {exc}") from exc
    run_id = document.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise TestnetError(f"{state_path} has no run_id")
    return run_id


class Testnet:
    """One testnet run (see the module doc)."""

    def __init__(self, options: TestnetOptions, echo: Callable[[str], None] = print) -> None:
        self.options = options
        self.echo = safe_echo(echo)
        check_kill_options(options.num_clients, options.random_kill_num, options.allowed_to_kill)
        if options.kill_signal not in KILL_SIGNALS:
            raise TestnetError(f"--kill-signal must be one of {', '.join(KILL_SIGNALS)}")
        check_server_kill(
            options.kill_server_at,
            options.duration if options.headless else None,
            options.random_kill_interval if options.random_kill_num else None,
        )
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.session = f"psyche-{stamp}-{secrets.token_hex(3)}"
        self.run_dir = (options.run_dir or Path("local-testnet-runs") / stamp).resolve()
        self.log_dir = self.run_dir / "logs"
        self.kills = 0
        self.server_restarts: list[ServerRestart] = []
        self.server_restart_error: str | None = None
        self.clients: list[_Client] = []
        self.tmux: TmuxTestnetSession | None = None
        self.server_pane: str | None = None
        self.stop_reason = ""

    # ------------------------------------------------------------ setup

    def _resolve_config(self) -> tuple[Path, Path | None]:
        if self.options.config_path is None:
            state = write_default_state(
                self.run_dir, self.options.num_clients, self.options.random_kill_num
            )
            self.echo(f"using the embedded default run: {state}")
            return state, None
        directory = self.options.config_path
        state = directory / "state.toml"
        if not state.is_file():
            raise TestnetError(f"--config-path {directory} has no state.toml")
        data = directory / "data.toml"
        return state.resolve(), (data.resolve() if data.is_file() else None)

    def _commands(self) -> TestnetCommands:
        state, data = self._resolve_config()
        return TestnetCommands(
            server_program=self.options.server_program or default_program("psyche-server"),
            client_program=self.options.client_program or default_program("psyche-client"),
            state_path=state,
            data_config_path=data,
            server_port=self.options.server_port,
            run_id=read_run_id(state),
            session=self.session,
            log_dir=self.log_dir,  # clients always log there: the summary reads those files
            server_log_file=self.options.write_log or self.options.headless,
            log_level=self.options.log_level,
            tui=self.options.tui and not self.options.headless,
            device=self.options.device,
            first_client_checkpoint=self.options.first_client_checkpoint,
            metrics=self.options.metrics,
            checkpoint_dir=self.run_dir / "checkpoints",
            save_state_dir=self.run_dir / "saved-states",  # what a server restart resumes from
            server_key_path=self.run_dir / "server.key",  # clients check it with --server-key
        )

    def _validate(self, commands: TestnetCommands) -> None:
        argv = commands.validate()
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        output = (result.stdout + result.stderr).strip()
        if output:
            self.echo(output)
        if result.returncode != 0:
            raise TestnetError(f"the configuration is invalid ({' '.join(argv)})")

    def _client_log(self, commands: TestnetCommands, client: _Client) -> Path | None:
        if commands.log_dir is None:
            return None
        return commands.log_dir / log_file_name(client.number, client.incarnation)

    def _client_command(self, commands: TestnetCommands, client: _Client) -> str:
        return commands.client(client.number, self._client_log(commands, client)).shell_command()

    def _server_alive(self) -> bool:
        assert self.tmux is not None and self.server_pane is not None
        return not self.tmux.status(self.server_pane).dead

    # ------------------------------------------------------------ running

    def _kill_and_restart(self, commands: TestnetCommands, numbers: list[int]) -> None:
        assert self.tmux is not None
        sig = KILL_SIGNALS[self.options.kill_signal]
        victims = [c for c in self.clients if c.number in numbers]
        signalled = [(c, self.tmux.send_signal(c.pane_id, sig)) for c in victims]
        for client, pid in signalled:
            if pid is None:
                self.echo(f"client {client.number} had already exited; restarting it")
            else:
                self.tmux.await_exit(client.pane_id, pid, VICTIM_EXIT_TIMEOUT)
                self.kills += 1
            client.incarnation += 1
            self.tmux.respawn(client.pane_id, self._client_command(commands, client))
        self.echo(f"killed and restarted client(s) {', '.join(map(str, numbers))} ({sig.name})")

    def _all_clients_dead(self) -> bool:
        assert self.tmux is not None
        return all(self.tmux.status(c.pane_id).dead for c in self.clients)

    def _restart_server(self, commands: TestnetCommands) -> bool:
        """Crash the server and restart it from its saved state; False if that failed (the
        testnet then stops)."""
        assert self.tmux is not None and self.server_pane is not None
        killed_at = time.time()  # wall clock, like the clients' log lines
        try:
            latest, step = kill_and_restart_server(
                self.tmux,
                self.server_pane,
                commands,
                self.options.startup_timeout,
                self.log_dir / f"server.{len(self.server_restarts)}.pane.txt",
            )
        except ServerRestartError as exc:
            self.server_restart_error = str(exc)
            tail = self.tmux.capture(self.server_pane).strip().splitlines()[-20:]
            if tail:
                self.echo("server output:\n  " + "\n  ".join(tail))
            return False
        self.server_restarts.append(ServerRestart(killed_at, step))
        self.echo(
            f"killed and restarted the server (SIGKILL); resumed from {latest} at step {step}"
        )
        return True

    def _supervise(self, commands: TestnetCommands, attached: subprocess.Popen | None) -> None:
        options = self.options
        started = time.monotonic()
        scheduler = None
        if options.random_kill_num:
            scheduler = KillScheduler(
                options.num_clients,
                options.random_kill_num,
                options.random_kill_interval,
                options.allowed_to_kill,
                start=started,
            )
        server_kill = None
        if options.kill_server_at is not None:
            server_kill = ServerKillSchedule(options.kill_server_at, start=started)
        watcher = FinishWatcher(self.log_dir) if commands.log_dir is not None else None
        while True:
            now = time.monotonic()
            reason = self._stop_reason(now - started, attached, watcher)
            if (
                reason is None
                and server_kill is not None
                and server_kill.take(now, scheduler is None or scheduler.due(now))
                and not self._restart_server(commands)
            ):
                reason = "the server did not restart"
            if reason is None and scheduler is not None:
                victims = scheduler.take_victims(now)
                if victims:
                    self._kill_and_restart(commands, victims)
            elif reason is None and options.headless and self._all_clients_dead():
                reason = "every client exited"
            if reason is not None:
                self.stop_reason = reason
                return
            time.sleep(TICK_SECONDS)

    def _stop_reason(
        self, elapsed: float, attached: subprocess.Popen | None, watcher: FinishWatcher | None
    ) -> str | None:
        """Why the testnet should stop now (None: keep running). Without random kills a
        headless testnet also stops once every client has exited (checked by the caller)."""
        options = self.options
        if attached is not None and attached.poll() is not None:
            return "detached from tmux"
        if not self._server_alive():
            return "the server exited"
        if options.headless and options.duration is not None and elapsed >= options.duration:
            return f"ran for {options.duration:g} s"
        if watcher is not None:
            watcher.poll()
            if watcher.finished and options.headless:
                return "the run finished"
        return None

    def _save_pane_output(self) -> None:
        if self.tmux is None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        panes = [("server", self.server_pane)] + [
            (f"client-{c.number}", c.pane_id) for c in self.clients
        ]
        for name, pane_id in panes:
            if pane_id is None:
                continue
            with contextlib.suppress(Exception):
                (self.log_dir / f"{name}.pane.txt").write_text(self.tmux.capture(pane_id) + "\n")

    def run(self) -> int:
        """Run the testnet; returns the process exit code."""
        options = self.options
        if not options.headless and not sys.stdout.isatty():
            raise TestnetError("not a terminal: use --headless to run without attaching to tmux")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        commands = self._commands()
        self._validate(commands)
        if commands.log_dir is not None:
            commands.log_dir.mkdir(parents=True, exist_ok=True)
        commands.write_server_key()
        self.tmux = TmuxTestnetSession(self.session, "psyche", self.run_dir)
        summary: Summary | None = None
        try:
            with signals_raise_interrupt():
                try:
                    self._start(commands)
                    attached = None if options.headless else self.tmux.attach()
                    self._supervise(commands, attached)
                except KeyboardInterrupt:
                    self.stop_reason = "interrupted"
        finally:
            with signals_ignored():
                self._save_pane_output()
                self.echo(f"stopping the testnet ({self.stop_reason or 'error'})...")
                self.tmux.close(signal.SIGINT, TEARDOWN_GRACE)
        if commands.log_dir is not None:
            summary = summarize(
                read_client_logs(commands.log_dir),
                kills=self.kills,
                server_finished=server_log_reports_finished(commands.log_dir / "server.log"),
                server_restarts=self.server_restarts,
                server_restart_error=self.server_restart_error,
            )
            for line in summary.render_lines():
                self.echo(line)
            self.echo(f"logs: {commands.log_dir}")
            self.echo(summary.final_line())
            return 0 if summary.ok else 1
        return 0 if self.server_restart_error is None else 1

    def _start(self, commands: TestnetCommands) -> None:
        assert self.tmux is not None
        port = self.options.server_port
        if port_in_use(port):  # the relay shares it: one port to check
            self.stop_reason = "the server port is taken"
            raise TestnetError(
                f"port {port} (the server port) is already in use (another testnet or "
                "server?); pick another with --server-port"
            )
        server = commands.server()
        self.echo(f"starting server: {' '.join(server.argv)}")
        self.server_pane = self.tmux.start(server.shell_command(), "server")
        self.echo(f"waiting for the server on port {self.options.server_port}...")
        try:
            wait_for_port(
                self.options.server_port, self.options.startup_timeout, self._server_alive
            )
        except ServerStartError as exc:
            self.stop_reason = "the server did not start"
            tail = self.tmux.capture(self.server_pane).strip().splitlines()[-20:]
            if tail:
                self.echo("server output:\n  " + "\n  ".join(tail))
            raise TestnetError(str(exc)) from None
        self.echo("server started")
        for number in range(1, self.options.num_clients + 1):
            client = _Client(number=number, pane_id="")
            command = self._client_command(commands, client)
            if number == 1:
                spec = commands.client(number, self._client_log(commands, client))
                self.echo(f"starting client 1: {' '.join(spec.argv)}")
            client.pane_id = self.tmux.add_pane(command, f"client {number}")
            self.clients.append(client)
        # Another terminal can watch the panes with `tmux -L $(cat RUN_DIR/tmux-socket) attach`.
        (self.run_dir / "tmux-socket").write_text(self.tmux.socket_name + "\n", encoding="utf-8")
        self.echo(f"tmux: {' '.join(self.tmux.attach_argv())}")
