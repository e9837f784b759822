"""Every input a user can give `psyche-client` (and a saved state given to `psyche-server`)
that cannot work ends the real program with a non-zero exit, no traceback, and a reason naming
the flag, field, file or peer at fault.

The cases run as parallel subprocesses against one shared server (a wrong `--run-id`) and one
silent listener (a port that is no coordinator); most fail in about a second, the silent
port after the client's 15 s handshake timeout.
"""

from __future__ import annotations

import socket
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomli_w

from bench.harness.client_run import BIN, Cluster, free_port, write_state

pytestmark = pytest.mark.timeout(400)

SAVED_STATE = Path(__file__).parents[1] / "unit" / "data" / "saved_state.toml"
DELEGATE = "ab" * 32


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]
    expect: tuple[str, ...]
    """Text the output must hold: the thing at fault, named."""
    program: str = "psyche-client"
    not_created: Path | None = None
    """A file the failed command must not have written."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("bad-inputs")
    cluster = Cluster(tmp, write_state(tmp / "state.toml", init_min_clients=8, min_clients=8))
    cluster.start_server()
    yield cluster
    cluster.stop()


@pytest.fixture
def listeners() -> Iterator[tuple[int, int]]:
    """Two ports that accept connections and never say anything: a silent one on loopback
    (no Psyche server), and a busy one on every interface (where a P2P listener binds)."""
    with socket.socket() as silent, socket.socket() as busy:
        silent.bind(("127.0.0.1", 0))
        busy.bind(("0.0.0.0", 0))
        for listener in (silent, busy):
            listener.listen()
        yield int(silent.getsockname()[1]), int(busy.getsockname()[1])


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _bad_saved_state(path: Path, table: str) -> Path:
    """The real saved state with a malformed `[epoch_state]` or `[verification]`."""
    document = tomllib.loads(SAVED_STATE.read_text())
    if table == "epoch_state":
        document["epoch_state"]["clients"][0]["state"] = "Happy"
    else:
        document["verification"] = {"convictions": [{"kind": "guilty"}]}
    path.write_text(tomli_w.dumps(document))
    return path


def _cases(tmp: Path, cluster: Cluster, silent_port: int, busy_port: int) -> list[Case]:
    server = f"127.0.0.1:{cluster.port}"
    train = ["train", "--server-addr", server, "--run-id", "e2e-run", "--logs", "console"]
    dummy = [*train, "--dummy-training-delay-secs", "0.1"]
    a_file = tmp / "a-file"
    a_file.write_text("not a directory")
    invalid_state = tmp / "invalid.toml"
    invalid_state.write_text('run_id = "x"\n')
    bad_epoch = _bad_saved_state(tmp / "bad-epoch.toml", "epoch_state")
    bad_verification = _bad_saved_state(tmp / "bad-verification.toml", "verification")
    short_key = tmp / "short.key"
    short_key.write_bytes(bytes(range(1, 32)))
    authorizer = tmp / "authorizer.key"
    authorizer.write_bytes(bytes(range(32)))
    authorize = ["authorize", "--authorizer-key", str(authorizer), "--delegate", DELEGATE]
    far_out = tmp / "far.auth"
    cases = [
        Case("check, invalid state", ["check", "--state", str(invalid_state)], ("model",)),
        Case(
            "check, malformed epoch_state",
            ["check", "--state", str(bad_epoch)],
            ("epoch_state.clients[0].state",),
        ),
        Case(
            "check --device mps",
            ["check", "--state", str(cluster.state), "--device", "mps"],
            ("--device mps",),
        ),
        Case(
            "check --fsdp --grad-accum-in-fp32",
            [
                "check",
                "--state",
                str(cluster.state),
                "--data-parallelism",
                "2",
                "--fsdp",
                "--grad-accum-in-fp32",
            ],
            ("--grad-accum-in-fp32",),
        ),
        Case(
            "--bind-p2p-port in use",
            [*dummy, "--bind-p2p-port", str(busy_port)],
            ("--bind-p2p-port",),
        ),
        Case(
            "--write-log cannot be created",
            [*dummy, "--write-log", str(a_file / "client.log")],
            ("--write-log", str(a_file)),
        ),
        Case(
            "--checkpoint-dir cannot be created",
            [*dummy, "--checkpoint-dir", str(a_file / "ckpt")],
            ("--checkpoint-dir",),
        ),
        Case(
            "--server-addr not HOST:PORT",
            ["train", "--server-addr", "nohost", "--run-id", "r"],
            ("--server-addr", "nohost"),
        ),
        Case(
            "--fsdp --grad-accum-in-fp32",
            [*train, "--data-parallelism", "2", "--fsdp", "--grad-accum-in-fp32"],
            ("--grad-accum-in-fp32", "--fsdp"),
        ),
        Case(
            "key file of 31 bytes", [*dummy, "-i", str(short_key)], (str(short_key), "got 31 bytes")
        ),
        Case(
            "wrong --run-id",
            [
                *[a if a != "e2e-run" else "wrong-run" for a in dummy],
            ],
            ("--run-id is 'wrong-run'", "run 'e2e-run'"),
        ),
        Case(
            "silent port",
            [*dummy[:2], f"127.0.0.1:{silent_port}", *dummy[3:]],
            (f"no Psyche handshake from 127.0.0.1:{silent_port} within 15 s",),
        ),
        Case(
            "authorize --expires too far",
            [*authorize, "--expires", "+99999999w", "--run-id", "r", "--out", str(far_out)],
            ("--expires", "+99999999w"),
            not_created=far_out,
        ),
        Case(
            "authorize --out into a missing directory",
            [*authorize, "--expires", "+1d", "--run-id", "r", "--out", str(tmp / "no" / "a")],
            ("--out", str(tmp / "no")),
        ),
        Case(
            "validate-config, malformed epoch_state",
            ["validate-config", "--state", str(bad_epoch)],
            ("epoch_state.clients[0].state",),
            program="psyche-server",
        ),
        Case(
            "run, malformed epoch_state",
            ["run", "--state", str(bad_epoch), "--no-tui", "-s", str(free_port())],
            ("epoch_state.clients[0].state",),
            program="psyche-server",
        ),
    ]
    cases += [
        Case(
            f"{command}, malformed verification",
            [command, "--state", str(bad_verification), *extra],
            ("verification.convictions[0].kind", "verification.convictions[0].trainer"),
            program="psyche-server",
        )
        for command, extra in (
            ("validate-config", []),
            ("run", ["--no-tui", "-s", str(free_port())]),
        )
    ]
    if not _cuda_available():
        cases += [
            Case(
                "check --device cuda",
                ["check", "--state", str(cluster.state), "--device", "cuda"],
                ("--device cuda",),
            ),
            Case("train --device cuda", [*train, "--device", "cuda"], ("--device cuda",)),
        ]
    return cases


def test_bad_inputs_end_with_a_reason_and_no_traceback(
    server: Cluster, tmp_path: Path, listeners: tuple[int, int]
) -> None:
    cases = _cases(tmp_path, server, *listeners)
    running = [
        (
            case,
            subprocess.Popen(
                [str(BIN / case.program), *case.argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server.env(),
            ),
        )
        for case in cases
    ]
    failures = []
    for case, process in running:
        try:
            output = process.communicate(timeout=240)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0].decode(errors="replace")
            failures.append(f"{case.name}: still running after 240 s:\n{output[-2000:]}")
            continue
        problems = []
        if process.returncode == 0:
            problems.append("exit status 0")
        if "Traceback" in output:
            problems.append("a traceback")
        missing = [text for text in case.expect if text not in output]
        if missing:
            problems.append(f"no mention of {missing}")
        if case.not_created is not None and case.not_created.exists():
            problems.append(f"{case.not_created} was written")
        if problems:
            failures.append(f"{case.name}: {', '.join(problems)}:\n{output[-2000:]}")
    assert not failures, "\n\n".join(failures)
