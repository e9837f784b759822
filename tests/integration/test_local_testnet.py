"""Local testnet orchestration with real tmux and stand-in server/client programs.

The stand-ins follow the CLI contract of psyche-server / psyche-client: the server listens on
--server-port and tells every connecting client when the run started; a client derives its step
from that start time and writes one JSON log line per step to --write-log, so restarted clients
rejoin at the current step with the same weights hash as everybody else. With --save-state-dir
the server writes `{run_id}-latest.toml` (the run's start time and its current step) at start-up
and after each connection, and a server started from that file keeps the run's start time, as a
restarted server resumes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.support.ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

TESTNET = Path(sys.executable).parent / "psyche-local-testnet"

FAKE_SERVER = textwrap.dedent(
    """
    import os, socket, sys, time
    args = sys.argv[1:]
    if "--die" in args:
        print("fake server: failing on purpose", flush=True)
        sys.exit(3)
    command = next(a for a in args if a in ("validate-config", "run"))
    state = args[args.index("--state") + 1]
    if command == "validate-config":
        if "INVALID" in open(state).read():
            print("Error found in config: INVALID marker", file=sys.stderr)
            sys.exit(1)
        print("Configs are OK!")
        sys.exit(0)
    port = int(args[args.index("--server-port") + 1])
    text = open(state).read()
    started = time.time()
    for line in text.splitlines():
        if line.startswith("fake_started = "):  # resuming from a file saved below
            started = float(line.split("=")[1])
    run_id = next(line.split('"')[1] for line in text.splitlines() if line.startswith("run_id"))

    def save():
        if "--save-state-dir" not in args or "--no-save" in args:
            return
        save_dir = args[args.index("--save-state-dir") + 1]
        os.makedirs(save_dir, exist_ok=True)
        step = int((time.time() - started) / 0.1) + 1
        with open(os.path.join(save_dir, f"{run_id}-latest.toml"), "w") as saved:
            saved.write(f'run_id = "{run_id}"\\nfake_started = {started}\\n[progress]\\nstep = {step}\\n')

    save()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    for line in range(5):  # a screenful of output, not one line
        print(f"fake server output line {line}", flush=True)
    print("fake server listening", port, "run started at", started, flush=True)
    while True:
        conn, _ = listener.accept()
        conn.sendall(f"{started}\\n".encode())
        conn.close()
        save()
    """
)

FAKE_CLIENT = textwrap.dedent(
    """
    import hashlib, json, os, socket, sys, time
    args = sys.argv[1:]
    host, port = args[args.index("--server-addr") + 1].split(":")
    log_path = args[args.index("--write-log") + 1]
    finish_at = int(args[args.index("--finish-at") + 1]) if "--finish-at" in args else None
    bad = args[args.index("--bad-log") + 1] if "--bad-log" in args else None
    secret = bytes.fromhex(os.environ["RAW_IDENTITY_SECRET_KEY"])
    client_id = hashlib.sha256(secret).hexdigest()[:8]
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        started = float(conn.makefile().readline())
    last = None
    with open(log_path, "a") as log:
        while True:
            step = int((time.time() - started) / 0.1) + 1
            if step != last:
                last = step
                digest = hashlib.sha256(str(step).encode()).hexdigest()
                if bad and bad in os.path.basename(log_path):
                    digest = "bad" + digest
                finished = finish_at is not None and step >= finish_at
                line = {"msg": "step applied", "client_id": client_id, "epoch": 0, "step": step,
                        "state": "Finished" if finished else "RoundTrain",
                        "loss": 5.0 / step, "weights_hash": digest}
                log.write(json.dumps(line) + "\\n")
                log.flush()
                print(json.dumps(line), flush=True)
                if finished:
                    sys.exit(0)
            time.sleep(0.02)
    """
)


@pytest.fixture
def fakes(tmp_path: Path) -> dict[str, str]:
    server = tmp_path / "fake_server.py"
    client = tmp_path / "fake_client.py"
    server.write_text(FAKE_SERVER)
    client.write_text(FAKE_CLIENT)
    return {"server": f"{sys.executable} {server}", "client": f"{sys.executable} {client}"}


def run_testnet(
    tmp_path: Path,
    fakes: dict[str, str],
    *args: str,
    client_extra: str = "",
    server_extra: str = "",
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    argv = start_argv(
        tmp_path,
        fakes,
        "--headless",
        "--startup-timeout",
        "20",
        *args,
        client_extra=client_extra,
        server_extra=server_extra,
    )
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def start_argv(
    tmp_path: Path,
    fakes: dict[str, str],
    *args: str,
    client_extra: str = "",
    server_extra: str = "",
    port: int | None = None,
) -> list[str]:
    """`psyche-local-testnet start ARGS` with the fake server and clients, in tmp_path/run, on
    `port` (default: a free one)."""
    return [
        str(TESTNET),
        "start",
        "--run-dir",
        str(tmp_path / "run"),
        "--server-port",
        str(free_port() if port is None else port),
        "--server-command",
        f"{fakes['server']} {server_extra}".strip(),
        "--client-command",
        f"{fakes['client']} {client_extra}".strip(),
        *args,
    ]


def final_summary(result: subprocess.CompletedProcess[str]) -> dict:
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("summary: "), result.stdout + result.stderr
    return json.loads(last.removeprefix("summary: "))


def leftover_processes(marker: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [
        line for line in out.stdout.splitlines() if str(marker) in line and "ps -eo" not in line
    ]


def tmux_server_alive(run_dir: Path) -> bool:
    """Whether the testnet's private tmux server (named in RUN_DIR/tmux-socket) still runs."""
    socket_name = (run_dir / "tmux-socket").read_text().strip()
    probe = subprocess.run(
        ["tmux", "-L", socket_name, "list-sessions"], capture_output=True, text=True, check=False
    )
    return probe.returncode == 0


def tmux_socket_left(output: str) -> bool:
    """Whether the testnet's private tmux socket file still exists."""
    match = re.search(r"tmux -L (\S+) attach-session", output)
    assert match, output
    directory = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}"
    return (directory / match.group(1)).exists()


def test_headless_run_to_the_end(tmp_path: Path, fakes: dict[str, str]) -> None:
    result = run_testnet(
        tmp_path, fakes, "--num-clients", "2", "--duration", "30", client_extra="--finish-at 15"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = final_summary(result)
    assert summary["ok"] and summary["advanced"] and summary["hashes_agree"]
    assert summary["finished"] and summary["clients_seen"] == 2
    assert summary["last_step"] >= 15 and summary["loss_end"] < summary["loss_start"]
    assert "the run finished" in result.stdout
    # The embedded default config was written and validated.
    assert (tmp_path / "run" / "state.toml").is_file()
    assert "Configs are OK!" in result.stdout
    assert (tmp_path / "run" / "logs" / "server.pane.txt").is_file()
    assert leftover_processes(tmp_path) == []
    assert not tmux_socket_left(result.stdout)


def test_random_kills_restart_clients_with_the_same_identity(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    result = run_testnet(
        tmp_path,
        fakes,
        "--num-clients",
        "3",
        "--duration",
        "5",
        "--random-kill-num",
        "1",
        "--random-kill-interval",
        "1",
        "--allowed-to-kill",
        "2,3",
        "--kill-signal",
        "KILL",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = final_summary(result)
    assert summary["kills"] >= 2 and summary["rejoins"] >= 1
    assert summary["hashes_agree"]
    logs = tmp_path / "run" / "logs"
    assert sorted(p.name for p in logs.glob("client-1.*.jsonl")) == ["client-1.0.jsonl"]
    for number in (2, 3):
        ids = {
            json.loads(line)["client_id"]
            for path in logs.glob(f"client-{number}.*.jsonl")
            for line in path.read_text().splitlines()
        }
        assert len(ids) == 1  # a restarted client keeps its identity
    restarted = list(logs.glob("client-2.[1-9]*.jsonl")) + list(logs.glob("client-3.[1-9]*.jsonl"))
    assert restarted
    assert leftover_processes(tmp_path) == []


def test_hash_disagreement_fails_the_run(tmp_path: Path, fakes: dict[str, str]) -> None:
    result = run_testnet(
        tmp_path, fakes, "--num-clients", "2", "--duration", "2", client_extra="--bad-log client-2."
    )
    assert result.returncode == 1
    summary = final_summary(result)
    assert summary["advanced"] and not summary["hashes_agree"] and summary["hash_mismatches"]
    assert "DISAGREE" in result.stdout
    assert leftover_processes(tmp_path) == []


def test_server_that_dies_is_reported(tmp_path: Path, fakes: dict[str, str]) -> None:
    # validate-config must pass first: --die only matters for `run`, so use a wrapper config.
    result = run_testnet(
        tmp_path, fakes, "--num-clients", "1", "--duration", "5", server_extra="--die"
    )
    assert result.returncode == 1
    assert "error:" in result.stderr
    assert leftover_processes(tmp_path) == []


def test_invalid_config_stops_before_tmux(tmp_path: Path, fakes: dict[str, str]) -> None:
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "state.toml").write_text('run_id = "x"\n# INVALID\n')
    result = run_testnet(tmp_path, fakes, "--num-clients", "1", "--config-path", str(config))
    assert result.returncode == 1
    assert "INVALID marker" in result.stdout + result.stderr
    assert "configuration is invalid" in result.stderr


def test_kill_options_are_checked(tmp_path: Path, fakes: dict[str, str]) -> None:
    result = run_testnet(
        tmp_path, fakes, "--num-clients", "2", "--random-kill-num", "3", "--duration", "1"
    )
    assert result.returncode == 1
    assert "--random-kill-num 3" in result.stderr


def test_attach_requires_a_terminal(tmp_path: Path, fakes: dict[str, str]) -> None:
    argv = [
        str(TESTNET),
        "start",
        "--num-clients",
        "1",
        "--run-dir",
        str(tmp_path / "r"),
        "--server-command",
        fakes["server"],
        "--client-command",
        fakes["client"],
    ]
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        check=False,
        env={**os.environ},
    )
    assert result.returncode == 1
    assert "--headless" in result.stderr


def _wait_for(predicate, timeout: float) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_ctrl_c_tears_everything_down(tmp_path: Path, fakes: dict[str, str]) -> None:
    """Also when the launcher was started with SIGINT ignored, as a shell starts a command in
    the background (`cmd &`; `make test` run that way once failed here)."""
    import signal

    argv = start_argv(tmp_path, fakes, "--headless", "--num-clients", "2")
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    logs = tmp_path / "run" / "logs"
    assert _wait_for(lambda: len(list(logs.glob("client-*.jsonl"))) == 2, 20)
    assert _wait_for(lambda: all(p.stat().st_size > 0 for p in logs.glob("client-*.jsonl")), 10)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    assert "stopping the testnet (interrupted)" in stdout, stdout + stderr
    assert stdout.strip().splitlines()[-1].startswith("summary: ")
    assert leftover_processes(tmp_path) == []


def test_attached_mode_in_a_terminal(tmp_path: Path, fakes: dict[str, str]) -> None:
    """With a terminal the testnet attaches to tmux; detaching tears everything down."""
    import pty
    import signal

    controller, terminal = pty.openpty()
    argv = start_argv(tmp_path, fakes, "--no-tui", "--write-log", "--num-clients", "2")
    env = {k: v for k, v in os.environ.items() if k != "TMUX"} | {"TERM": "xterm"}
    process = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    output = bytearray()

    def drain() -> None:
        import select

        while select.select([controller], [], [], 0)[0]:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                return
            if not chunk:
                return
            output.extend(chunk)

    logs = tmp_path / "run" / "logs"

    def clients_logging() -> bool:
        drain()
        files = list(logs.glob("client-*.jsonl"))
        return len(files) == 2 and all(p.stat().st_size > 0 for p in files)

    try:
        assert _wait_for(clients_logging, 60), (
            f"{output.decode(errors='replace')}\nlogs: {sorted(p.name for p in logs.glob('*'))}"
        )
        # tmux may flush the terminal's pending output when it attaches, so the printed attach
        # command can be lost here: the run directory names the socket too.
        socket_name = (tmp_path / "run" / "tmux-socket").read_text().strip()
        clients = subprocess.run(
            ["tmux", "-L", socket_name, "list-clients"], capture_output=True, text=True, check=False
        )
        assert clients.stdout.strip(), "the testnet did not attach to tmux"
        subprocess.run(["tmux", "-L", socket_name, "detach-client", "-s", "psyche"], check=True)
        assert _wait_for(lambda: (drain(), process.poll() is not None)[1], 30)
    finally:
        if process.poll() is None:  # a failed check: let the launcher tear down, then kill it
            process.send_signal(signal.SIGTERM)
            _wait_for(lambda: (drain(), process.poll() is not None)[1], 30)
            if process.poll() is None:
                process.kill()
        os.close(controller)
    text = output.decode(errors="replace")
    assert "stopping the testnet (detached from tmux)" in text
    assert "summary: " in text
    assert leftover_processes(tmp_path) == []
    assert not tmux_server_alive(tmp_path / "run")


def test_port_already_in_use_is_refused(tmp_path: Path, fakes: dict[str, str]) -> None:
    """The server's port taken (the relay shares it): refused before starting."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        argv = start_argv(tmp_path, fakes, "--headless", "--num-clients", "1", port=taken)
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 1
    assert f"port {taken} (the server port) is already in use" in result.stderr, result.stderr
    assert leftover_processes(tmp_path) == []


def test_headless_stops_when_every_client_exited(tmp_path: Path, fakes: dict[str, str]) -> None:
    fakes = {**fakes, "client": f"{sys.executable} -c pass"}
    result = run_testnet(tmp_path, fakes, "--num-clients", "2", "--duration", "60", timeout=40)
    assert result.returncode == 1
    assert "stopping the testnet (every client exited)" in result.stdout
    assert final_summary(result)["ok"] is False
    assert leftover_processes(tmp_path) == []


def test_closing_the_terminal_tears_everything_down(tmp_path: Path, fakes: dict[str, str]) -> None:
    """SIGHUP from a closed terminal: teardown must finish although nothing can be printed."""
    import pty

    controller, terminal = pty.openpty()
    argv = start_argv(tmp_path, fakes, "--no-tui", "--num-clients", "2", "--write-log")
    env = {k: v for k, v in os.environ.items() if k != "TMUX"} | {"TERM": "xterm"}
    process = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    logs = tmp_path / "run" / "logs"

    def drain_and_check() -> bool:
        import select

        while select.select([controller], [], [], 0)[0]:
            try:
                if not os.read(controller, 65536):
                    break
            except OSError:
                break
        files = list(logs.glob("client-*.jsonl"))
        return len(files) == 2 and all(p.stat().st_size > 0 for p in files)

    try:
        assert _wait_for(drain_and_check, 60)
    finally:
        os.close(controller)  # the terminal goes away: the launcher gets SIGHUP
    try:
        process.wait(timeout=40)
    finally:
        if process.poll() is None:
            process.kill()
    assert _wait_for(lambda: leftover_processes(tmp_path) == [], 10), leftover_processes(tmp_path)
    assert not tmux_server_alive(tmp_path / "run")


def test_server_killed_and_restarted_from_its_saved_state(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    result = run_testnet(
        tmp_path,
        fakes,
        "--num-clients",
        "3",
        "--duration",
        "6",
        "--kill-server-at",
        "1.5",
        "--random-kill-num",
        "1",
        "--random-kill-interval",
        "1",
        "--kill-signal",
        "KILL",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "killed and restarted the server (SIGKILL)" in result.stdout
    # The planned kill is no reason to stop: the testnet ran for its whole duration.
    assert "stopping the testnet (ran for 6 s)" in result.stdout, result.stdout
    summary = final_summary(result)
    assert summary["ok"] and summary["server_restarts"] == 1, summary
    assert summary["kills"] >= 3 and summary["hashes_agree"]
    # The restarted server resumed from the file the killed one saved last (the step of the
    # last client connection before the kill: clients were restarted by then) and went on with
    # the same run: both servers report the same start time.
    [resumed_at] = summary["server_resume_steps"]
    assert resumed_at > 1, summary
    # Both servers' whole output is in the pane, the killed one's above; it is also saved.
    pane = (tmp_path / "run" / "logs" / "server.pane.txt").read_text()
    killed, restarted = re.findall(r"run started at (\S+)", pane)
    assert killed == restarted, pane
    assert pane.count("fake server output line 4") == 2, pane
    saved_output = (tmp_path / "run" / "logs" / "server.0.pane.txt").read_text()
    assert saved_output.count("run started at") == 1, saved_output
    saved = (tmp_path / "run" / "saved-states" / "local-testnet-latest.toml").read_text()
    assert f"fake_started = {killed}" in saved
    assert leftover_processes(tmp_path) == []


def test_failed_server_restart_stops_and_fails_the_run(
    tmp_path: Path, fakes: dict[str, str]
) -> None:
    result = run_testnet(
        tmp_path,
        fakes,
        "--num-clients",
        "2",
        "--duration",
        "20",
        "--kill-server-at",
        "1",
        server_extra="--no-save",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "stopping the testnet (the server did not restart)" in result.stdout
    summary = final_summary(result)
    assert summary["ok"] is False and summary["server_restarts"] == 0
    assert "the server saved no state to resume from" in summary["server_restart_error"]
    assert leftover_processes(tmp_path) == []


def test_server_kill_option_is_checked(tmp_path: Path, fakes: dict[str, str]) -> None:
    result = run_testnet(
        tmp_path, fakes, "--num-clients", "1", "--duration", "5", "--kill-server-at", "10"
    )
    assert result.returncode == 1
    assert "--kill-server-at 10 must come before the end of the run" in result.stderr
    zero = run_testnet(tmp_path, fakes, "--num-clients", "1", "--kill-server-at", "0")
    assert zero.returncode == 2 and "--kill-server-at" in zero.stderr
