"""A clean stop on SIGTERM and SIGINT: the client handles both signals itself, on its event
loop, instead of dying where the signal found it.

`run_until_signalled(job)` runs the client's main coroutine as a task; the first SIGTERM or
SIGINT logs that the client is stopping and cancels that task, whose cleanup closes the server
connection first (the server withdraws a disconnected client from the epoch at once,
`--withdraw-on-disconnect`), then the round pipeline, the P2P node and the metrics sink. The
process then exits 0 with a line saying it stopped. A second signal while it stops cancels the
cleanup too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine, Sequence
from typing import Any

log = logging.getLogger("psyche.client")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def run_until_signalled(
    job: Coroutine[Any, Any, int], signals: Sequence[signal.Signals] = STOP_SIGNALS
) -> int:
    """`job`'s exit code, or 0 when one of `signals` stopped it (see the module docstring).
    Where the loop cannot take signal handlers (not the main thread), `job` runs as is."""
    loop = asyncio.get_running_loop()
    task: asyncio.Task[int] = asyncio.ensure_future(job)
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        if received:
            log.warning("%s again: stopping without finishing the cleanup", sig.name)
        else:
            log.info("%s received: stopping and leaving the run", sig.name)
        received.append(sig.name)
        task.cancel()

    installed: list[signal.Signals] = []
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    try:
        code = await task
    except asyncio.CancelledError:
        if not received or not task.cancelled():
            raise  # cancelled from outside (the dashboard quit), not by a signal
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    if received:
        log.info("stopped on %s; exiting", received[0])
        return 0
    return code
