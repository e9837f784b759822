"""Process-lifecycle helpers of the testnet launcher: server readiness, signal handling during
the run and during teardown, output that survives a vanished terminal, and a follower of the
JSON logs that notices the run finishing."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from psyche_local_testnet.summary import line_reports_finished


class ServerStartError(RuntimeError):
    """The server did not open its port (it exited, or the timeout passed)."""


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    return False


def wait_for_port(
    port: int, timeout: float, still_starting: Callable[[], bool], host: str = "127.0.0.1"
) -> None:
    """Wait until something accepts TCP connections on `port`; fail early if the server dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
            return
        if not still_starting():
            raise ServerStartError("the server exited before it opened its port")
        time.sleep(0.2)
    raise ServerStartError(f"the server did not open port {port} within {timeout:.0f} s")


@contextlib.contextmanager
def signals_raise_interrupt() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into KeyboardInterrupt so teardown runs. SIGINT too,
    explicitly: a launcher started in the background by a shell (`cmd &`) inherits SIGINT
    ignored, and Python then installs no Ctrl-C handler of its own."""

    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """Teardown must not be cut short by a second Ctrl-C, SIGTERM or a closing terminal."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def safe_echo(echo: Callable[[str], None]) -> Callable[[str], None]:
    """`echo` that ignores a vanished terminal (EIO/EPIPE), so teardown always completes."""

    def say(text: str) -> None:
        with contextlib.suppress(OSError):
            echo(text)

    return say


class FinishWatcher:
    """Follows the client logs and server.log as they grow, to notice the run finishing."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offsets: dict[Path, int] = {}
        self.finished = False

    def poll(self) -> None:
        if not self.directory.is_dir():
            return
        for path in [*self.directory.glob("client-*.jsonl"), self.directory / "server.log"]:
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as file:
                    file.seek(offset)
                    chunk = file.read()
            except OSError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._offsets[path] = offset + len(complete)
            lines = complete.decode("utf-8", errors="replace").splitlines()
            if any(line_reports_finished(line) for line in lines):
                self.finished = True
