"""Every bad input a user can give `psyche-server` ends the real program with a non-zero exit,
no traceback, and a reason naming the flag, field or file at fault (and for a saved state the
coordinator cannot resume from, `validate-config` and `run` agree)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.server_harness import write_state

SERVER = [sys.executable, "-m", "psyche_server"]


def server(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`psyche-server ARGS` to its end (a start that should fail must fail within 60 s)."""
    return subprocess.run(
        [*SERVER, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _state(tmp: Path) -> Path:
    return write_state(tmp / "state.toml")


def _with_text(name: str, text: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / name).write_text(text)
        return tmp / name

    return make


def _malformed_epoch_state(tmp: Path) -> Path:
    state = _state(tmp)
    state.write_text(state.read_text() + '\n[epoch_state]\nclients = "bogus"\n')
    return state


DATA_TOML = 'dir = "tokens"\ntoken_size = "TwoBytes"\nseq_len = 0\nshuffle_seed = [1]\n'

# (case, files made in tmp -> `run` arguments after --no-tui, what the reason must name)
CASES: list[tuple[str, Callable[[Path], list[str]], tuple[str, ...]]] = [
    (
        "empty authorized-keys",
        lambda t: ["--state", str(_state(t)), "--authorized-keys", str(_with_text("k", "")(t))],
        ("--authorized-keys", "lists no key"),
    ),
    (
        "authorized-keys with a bad line",
        lambda t: ["--state", str(_state(t)), "--authorized-keys", str(_with_text("k", "xy\n")(t))],
        ("--authorized-keys", "line 1"),
    ),
    (
        "otlp url that is no url",
        lambda t: ["--state", str(_state(t)), "--otlp-metrics-url", "notaurl"],
        ("--otlp-metrics-url", "notaurl"),
    ),
    (
        "key path in a missing directory",
        lambda t: ["--state", str(_state(t)), "--identity-secret-key-path", str(t / "kyes/s.key")],
        ("--identity-secret-key-path", "kyes does not exist"),
    ),
    (
        "key file that is no key",
        lambda t: [
            "--state",
            str(_state(t)),
            "--identity-secret-key-path",
            str(_with_text("s.key", "not a key\n")(t)),
        ],
        ("--identity-secret-key-path", "32 raw bytes or 64 hex characters"),
    ),
    (
        "key path that is a directory",
        lambda t: ["--state", str(_state(t)), "--identity-secret-key-path", str(t)],
        ("--identity-secret-key-path", "is a directory"),
    ),
    (
        "malformed epoch_state",
        lambda t: ["--state", str(_malformed_epoch_state(t))],
        ("epoch_state", "state.toml"),
    ),
    ("missing state file", lambda t: ["--state", str(t / "nope.toml")], ("--state", "nope.toml")),
    ("state file that is a directory", lambda t: ["--state", str(t)], ("--state", "directory")),
    (
        "state file that is no TOML",
        lambda t: ["--state", str(_with_text("s.toml", "run_id = [\n")(t))],
        ("s.toml", "not valid TOML"),
    ),
    (
        "port out of range",
        lambda t: ["--state", str(_state(t)), "--server-port", "70000"],
        ("--server-port", "70000"),
    ),
    (
        "relay port out of range",
        lambda t: ["--state", str(_state(t)), "--relay-port", "-1"],
        ("--relay-port",),
    ),
    (
        "save-state-dir under a file",
        lambda t: ["--state", str(_state(t)), "--save-state-dir", str(_state(t) / "saves")],
        ("--save-state-dir", "Not a directory"),
    ),
    (
        "save-state-dir that is a file",
        lambda t: ["--state", str(_state(t)), "--save-state-dir", str(_state(t))],
        ("--save-state-dir", "is a file"),
    ),
    (
        "data-config that is a directory",
        lambda t: ["--state", str(_state(t)), "--data-config", str(t)],
        ("--data-config", "directory"),
    ),
    (
        "data-config with bad fields",
        lambda t: [
            "--state",
            str(_state(t)),
            "--data-config",
            str(_with_text("d.toml", DATA_TOML)(t)),
        ],
        ("d.toml", "seq_len", "shuffle_seed"),
    ),
    (
        "log file under a file",
        lambda t: ["--state", str(_state(t)), "--log-file", str(_state(t) / "server.log")],
        ("--log-file", "state.toml"),
    ),
    (
        "log level that does not exist",
        lambda t: ["--state", str(_state(t)), "--log-level", "loud"],
        ("--log-level", "loud"),
    ),
]


def _assert_refused(result: subprocess.CompletedProcess[str], *names: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    for name in names:
        assert name in output, (name, output)


@pytest.mark.parametrize(("case", "arguments", "names"), CASES, ids=[c[0] for c in CASES])
def test_run_refuses_a_bad_input_naming_it(
    tmp_path: Path,
    case: str,
    arguments: Callable[[Path], list[str]],
    names: tuple[str, ...],
) -> None:
    result = server("run", "--no-tui", *arguments(tmp_path), cwd=tmp_path)
    _assert_refused(result, *names)
    assert not (tmp_path / "kyes").exists()  # a mistyped key directory is not created


def test_run_refuses_a_port_in_use(tmp_path: Path, busy_port: int) -> None:
    state = _state(tmp_path)
    result = server("run", "--no-tui", "--state", str(state), "-s", str(busy_port), cwd=tmp_path)
    _assert_refused(result, f"cannot listen on 0.0.0.0:{busy_port}")


def test_run_refuses_a_data_server_port_in_use(tmp_path: Path, busy_port: int) -> None:
    state = write_state(
        tmp_path / "state.toml", data_location={"Server": f"127.0.0.1:{busy_port}"}, max_seq_len=8
    )
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "a.bin").write_bytes(bytes(2 * 8 * 64))
    data = tmp_path / "data.toml"
    data.write_text(DATA_TOML.replace("seq_len = 0", "seq_len = 8").replace("[1]", str([1] * 32)))
    result = server(
        "run", "--no-tui", "--state", str(state), "--data-config", str(data), cwd=tmp_path
    )
    _assert_refused(result, "cannot start the data server", str(busy_port), "data_location")


def test_validate_config_and_run_agree_on_a_malformed_epoch_state(tmp_path: Path) -> None:
    state = _malformed_epoch_state(tmp_path)
    checked = server("validate-config", "--state", str(state), cwd=tmp_path)
    _assert_refused(checked, "epoch_state")
    assert "Configs are OK!" not in checked.stdout
    ran = server("run", "--no-tui", "--state", str(state), cwd=tmp_path)
    _assert_refused(ran, "epoch_state")
