"""Helpers for the client end-to-end tests: a real `psyche-server` and real `psyche-client`
processes on loopback, with JSON logs parsed from their stderr files."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.support.ports import free_port

BIN = Path(sys.executable).parent

STATE_TEMPLATE = """
run_id = "{run_id}"
run_state = "WaitingForMembers"
[config]
warmup_time = {warmup_time}
cooldown_time = {cooldown_time}
max_round_train_time = {max_round_train_time}
round_witness_time = {round_witness_time}
epoch_time = {epoch_time}
waiting_for_members_extra_time = 1
total_steps = {total_steps}
init_min_clients = {init_min_clients}
min_clients = {min_clients}
witness_nodes = {witness_nodes}
verification_percent = {verification_percent}
global_batch_size_start = {batch}
global_batch_size_end = {batch}
global_batch_size_warmup_tokens = 0
[model.LLM]
architecture = "{architecture}"
data_type = "Pretraining"
max_seq_len = {seq_len}
cold_start_warmup_steps = 0
data_location = {data_location}
[model.LLM.checkpoint.Hub]
repo_id = "{model}"
[model.LLM.lr_schedule.Constant]
base_lr = 3.0e-3
warmup_init_lr = 0.0
warmup_steps = 0
[model.LLM.optimizer.Distro]
compression_chunk = 64
compression_topk = 8
quantize_1bit = {quantize_1bit}
compression_decay = 0.999
clip_grad_norm = 1.0
"""


def no_server_train(*extra: str) -> list[str]:
    """`psyche-client train` of a dummy client against a port where no server listens
    (127.0.0.1:9), with `extra` flags: for what a client does before (or without) a server."""
    return [
        str(BIN / "psyche-client"),
        "train",
        "--server-addr",
        "127.0.0.1:9",
        "--run-id",
        "x",
        "--dummy-training-delay-secs",
        "0.1",
        *extra,
    ]


def write_state(path: Path, **overrides: Any) -> Path:
    values: dict[str, Any] = {
        "run_id": "e2e-run",
        "warmup_time": 60,
        "cooldown_time": 3,
        "max_round_train_time": 20,
        "round_witness_time": 1,
        "epoch_time": 600,
        "total_steps": 10,
        "init_min_clients": 3,
        "min_clients": 2,
        "witness_nodes": 1,
        "batch": 6,
        "seq_len": 32,
        "data_location": '{ Builtin = "python-stdlib" }',
        "verification_percent": 0,
        "quantize_1bit": "true",
        "architecture": "HfLlama",
        "model": "builtin:llama-tiny",
    }
    values.update(overrides)
    path.write_text(STATE_TEMPLATE.format(**values))
    return path


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def lines(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not self.log_path.exists():
            return out
        for raw in self.log_path.read_text(errors="replace").splitlines():
            if raw.startswith("{"):
                try:
                    out.append(json.loads(raw))
                except json.JSONDecodeError:
                    continue
        return out

    def events(self, msg: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("msg") == msg]

    def events_with(self, key: str) -> list[dict[str, Any]]:
        """Log lines that carry the structured field `key`."""
        return [line for line in self.lines() if key in line]

    def p2p_port(self, timeout: float = 60) -> int:
        """The port the client's P2P node listens on, from its log (start clients with the
        default `--bind-p2p-port 0`: a port picked in advance can be taken by another socket,
        a flood's for one, before the client binds it)."""
        found: list[int] = []

        def listening() -> bool:
            for line in self.lines():
                message = str(line.get("msg", ""))
                if message.startswith("P2P node ") and " listening on " in message:
                    found.append(int(message.rsplit(":", 1)[1]))
                    return True
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited before listening:\n{self.tail()}")
            return False

        wait_for(listening, timeout, f"{self.name}'s P2P listener")
        return found[0]

    def kill(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def tail(self, n: int = 15) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


@dataclass
class Cluster:
    tmp: Path
    state: Path
    port: int = field(default_factory=free_port)
    server: Proc | None = None
    clients: list[Proc] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.setdefault("PSYCHE_CACHE_DIR", str(self.tmp / "cache"))
        return env

    def start_server(self, *extra: str, state: Path | None = None, name: str = "server") -> Proc:
        """Start `psyche-server run` on the cluster's port (`state`: another state file, e.g.
        a saved one to restart from; `extra`: more flags); waits until the port is open."""
        log = self.tmp / f"{name}.log"
        popen = subprocess.Popen(
            [
                str(BIN / "psyche-server"),
                "run",
                "--state",
                str(state or self.state),
                "--no-tui",
                "-s",
                str(self.port),
                "--host",
                "127.0.0.1",
                "--log-format",
                "json",
                *extra,
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=self.env(),
        )
        self.server = Proc(name, popen, log)
        wait_for(lambda: _port_open(self.port), 30, "server port", self.diagnostics)
        return self.server

    def start_client(
        self,
        *extra: str,
        dummy_delay: float | None = None,
        run_id: str = "e2e-run",
        program: list[str] | None = None,
        device: str = "cpu",
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        """A `psyche-client train` process (or `program` given the same arguments) training
        on `device` (`--device`), with `env` added to its environment."""
        index = len(self.clients)
        log = self.tmp / f"client{index}.log"
        args = [
            *(program or [str(BIN / "psyche-client")]),
            "train",
            "--server-addr",
            f"127.0.0.1:{self.port}",
            "--run-id",
            run_id,
            "--device",
            device,
            "--logs",
            "json",
            *extra,
        ]
        if dummy_delay is not None:
            args += ["--dummy-training-delay-secs", str(dummy_delay)]
        popen = subprocess.Popen(
            args, stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**self.env(), **(env or {})}
        )
        proc = Proc(f"client{index}", popen, log)
        self.clients.append(proc)
        return proc

    def stop(self) -> None:
        for proc in [*self.clients, *([self.server] if self.server else [])]:
            proc.kill(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in [*self.clients, *([self.server] if self.server else [])]:
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()

    def diagnostics(self) -> str:
        parts = [f"--- {p.name} (rc={p.popen.poll()})\n{p.tail()}" for p in self.clients]
        if self.server:
            parts.append(f"--- server\n{self.server.tail()}")
        return "\n".join(parts)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    diagnostics: Callable[[], str] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    extra = diagnostics() if diagnostics else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{extra}")


def applied_hashes(proc: Proc) -> dict[int, str]:
    return {e["step"]: e["weights_hash"] for e in proc.events("applied step")}


def losses(proc: Proc) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in proc.events("trained step") if e.get("loss") is not None}


def finish_in_agreement(cluster: Cluster, honest: list[Proc], min_common: int) -> list[int]:
    """Wait (up to 240 s) for the `honest` clients to exit; assert that each exited 0 and that
    all hold the same weights hash at every step they all applied, of which there are at least
    `min_common`. Returns those steps."""
    wait_for(
        lambda: all(p.popen.poll() is not None for p in honest),
        240,
        "the honest clients to finish",
        cluster.diagnostics,
    )
    assert [p.popen.returncode for p in honest] == [0] * len(honest), cluster.diagnostics()
    tables = [applied_hashes(p) for p in honest]
    common = sorted(set.intersection(*(set(t) for t in tables)))
    assert len(common) >= min_common, (
        f"only {len(common)} common applied steps\n{cluster.diagnostics()}"
    )
    for step in common:
        assert len({t[step] for t in tables}) == 1, f"honest clients differ at step {step}"
    return common
