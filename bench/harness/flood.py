"""A test-only connection flood: idle TCP sockets held open against one port.

`Flood(port, source, count)` keeps up to `count` connections from the loopback address
`source` open to `127.0.0.1:port` without ever sending a byte, and reopens every one the
target closes, until `stop()`. It counts what the target did: `opened` (connects that
succeeded) and `closed_by_target` (held sockets the target shut: caps at accept, handshake or
pre-join timeouts). A distinct `source` (any 127.x.y.z works on Linux loopback) lets the test's
honest processes on 127.0.0.1 stay outside per-address caps, as on the internet.
"""

from __future__ import annotations

import select
import socket
import threading


class Flood:
    def __init__(self, port: int, source: str = "127.0.0.2", count: int = 300) -> None:
        self.port = port
        self.source = source
        self.count = count
        self.opened = 0
        self.closed_by_target = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"flood-{port}", daemon=True)

    @property
    def shed(self) -> bool:
        """Whether the target shed the flood (closed sockets of it)."""
        return self.closed_by_target > 0

    def start(self) -> Flood:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self._held:
            sock.close()
        self._held.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._reap()
            while len(self._held) < self.count and not self._stop.is_set():
                sock = socket.socket()
                sock.settimeout(0.5)
                try:
                    sock.bind((self.source, 0))
                    sock.connect(("127.0.0.1", self.port))
                except OSError:
                    sock.close()
                    break
                self.opened += 1
                self._held.append(sock)
            self._stop.wait(0.2)

    def _reap(self) -> None:
        if not self._held:
            return
        readable, _, _ = select.select(self._held, [], [], 0)
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                continue  # a challenge or greeting: never answered, the target times us out
            self.closed_by_target += 1
            self._held.remove(sock)
            sock.close()
