"""The process tests' free ports come from below the kernel's ephemeral range, where no
outbound connection can be handed them before the child process binds them."""

from __future__ import annotations

import socket

import pytest

from bench.support import ports
from bench.support.ports import ephemeral_low, free_port


def test_free_ports_lie_below_the_ephemeral_range_and_can_be_bound() -> None:
    low = ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1, "the same port every time"
    for port in ports:
        assert 1024 <= port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 40 of the 50 ports drawn from held, a draw that skipped the check would hand one
    out nearly every time."""
    monkeypatch.setattr(ports, "SPAN", 50)
    low = ephemeral_low()
    held: list[socket.socket] = []
    try:
        for port in range(low - 50, low - 10):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        taken = {sock.getsockname()[1] for sock in held}
        assert not taken & {free_port() for _ in range(200)}
    finally:
        for sock in held:
            sock.close()
