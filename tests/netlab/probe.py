"""A tiny TCP probe run inside lab hosts (test-only): `listen PORT` accepts connections and
drains each, `send HOST PORT NBYTES` connects (5 s timeout), sends NBYTES and prints a JSON
line with `connected`, `seconds` and `mbit`, or `{"connected": false, "error": ...}`."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def listen(port: int) -> None:
    server = socket.create_server(("0.0.0.0", port))
    print("listening", flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_drain, args=(conn,), daemon=True).start()


def _drain(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(30)
        total = 0
        while chunk := conn.recv(1 << 16):
            total += len(chunk)
        conn.sendall(str(total).encode())


def send(host: str, port: int, nbytes: int) -> dict[str, object]:
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError as exc:
        return {"connected": False, "error": f"{type(exc).__name__}: {exc}"}
    with sock:
        sock.settimeout(60)
        started = time.monotonic()
        block = b"x" * (1 << 16)
        left = nbytes
        while left > 0:
            left -= sock.send(block[: min(left, len(block))])
        sock.shutdown(socket.SHUT_WR)
        received = int(sock.recv(64) or b"0")
        seconds = time.monotonic() - started
    return {"connected": True, "received": received, "seconds": seconds,
            "mbit": nbytes * 8 / seconds / 1e6}  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen(int(sys.argv[2]))
    else:
        print(json.dumps(send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))), flush=True)
