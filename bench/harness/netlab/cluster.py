"""A run inside a lab: a real `psyche-server` and real `psyche-client` processes, each in its
own lab host, with JSON logs read back like tests/e2e does (`Proc`, `applied_hashes`)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.client_run import Proc, wait_for

from .lab import Lab

CLIENT = [sys.executable, "-c", "from psyche_client.cli import main; main()"]
"""`psyche-client` from this checkout (the package has no `__main__`)."""
SERVER_PORT = 20000
P2P_PORT = 20010


@dataclass
class LabCluster:
    """`start_server(host)`, then `start_client(host, ...)` for each client host."""

    lab: Lab
    tmp: Path
    state: Path
    server: Proc | None = None
    server_host: str = ""
    clients: list[Proc] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.setdefault("PSYCHE_CACHE_DIR", str(self.tmp / "cache"))
        return env

    @property
    def server_addr(self) -> str:
        return f"{self.lab.hosts[self.server_host].address}:{SERVER_PORT}"

    def start_server(self, host: str, *extra: str) -> Proc:
        log = self.tmp / "server.log"
        args = [sys.executable, "-m", "psyche_server", "run", "--state", str(self.state),
                "--no-tui", "-s", str(SERVER_PORT), "--host", "0.0.0.0",
                "--log-format", "json", *extra]  # fmt: skip
        popen = self.lab.popen(host, args, log=log, env=self.env())
        self.server = Proc("server", popen, log)
        self.server_host = host
        wait_for(
            lambda: popen.poll() is not None or self._server_listening(),
            60,
            "the server's port",
            self.diagnostics,
        )
        if popen.poll() is not None:
            raise AssertionError(f"the server exited with {popen.returncode}\n{self.diagnostics()}")
        return self.server

    def start_client(self, host: str, *extra: str, dummy_delay: float | None = 0.3) -> Proc:
        """`psyche-client train` inside lab host `host`, on P2P port `P2P_PORT`."""
        log = self.tmp / f"{host}.log"
        args = [*CLIENT, "train", "--server-addr",
                self.server_addr, "--run-id", "e2e-run", "--device", "cpu", "--logs", "json",
                "--bind-p2p-port", str(P2P_PORT), *extra]  # fmt: skip
        if dummy_delay is not None:
            args += ["--dummy-training-delay-secs", str(dummy_delay)]
        popen = self.lab.popen(host, args, log=log, env=self.env())
        proc = Proc(host, popen, log)
        self.clients.append(proc)
        return proc

    def _server_listening(self) -> bool:
        out = self.lab.run(self.server_host, "ss", "-Hltn", f"sport = :{SERVER_PORT}", check=False)
        return bool(out.strip())

    def diagnostics(self) -> str:
        parts = [f"--- {p.name} (rc={p.popen.poll()})\n{p.tail(25)}" for p in self.clients]
        if self.server:
            parts.append(f"--- server\n{self.server.tail(25)}")
        return "\n".join(parts)
