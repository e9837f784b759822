"""Free loopback ports for the process tests, drawn below the kernel's ephemeral range.

A port from `bind(("127.0.0.1", 0))` is an ephemeral one: between closing the probe and the
child process binding it, any outbound connection on the machine may be given that same port
(a full run failed once so, "address already in use", with the data server loading 63 MB
first). Ports below the range are never handed out by the kernel, so only another test that
drew the same one at random can take it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SPAN = 12000
"""How many ports below the ephemeral range to draw from."""


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where the file is unreadable)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port nothing listens on now, below the ephemeral range where that holds room enough,
    else one the kernel picks."""
    low = ephemeral_low()
    draw = random.SystemRandom()
    if low - SPAN >= 1024:
        for _ in range(100):
            port = draw.randrange(low - SPAN, low)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
