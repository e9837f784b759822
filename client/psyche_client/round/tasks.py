"""The round pipeline's background tasks: spawned, cancelled per round, and fatal on failure.

Round-scoped tasks (downloads, training, apply) are cancelled when the pipeline leaves an
epoch; long-lived ones (model loading, Cooldown work) are cancelled only on close. The first
task that fails with an exception records it and wakes `wait_fatal`, which ends the client;
an `EndOfRun` ends it too, on purpose (logged without a traceback; exit code 0).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("psyche.client")

T = TypeVar("T")


class EndOfRun(Exception):
    """The run is over for this client though the coordinator has not finished it (its
    training data ran out): the message says why; the client exits with status 0."""


class TaskSet:
    def __init__(self, log_fields: Callable[[], dict[str, Any]]) -> None:
        self._log_fields = log_fields
        self._round: set[asyncio.Task[Any]] = set()
        self._long: set[asyncio.Task[Any]] = set()
        self._fatal_event = asyncio.Event()
        self.fatal: BaseException | None = None

    def spawn(self, coro: Coroutine[Any, Any, T], *, round_scoped: bool = True) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        (self._round if round_scoped else self._long).add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._round.discard(task)
        self._long.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self.fatal is None:
            if isinstance(exc, EndOfRun):
                log.warning("%s", exc, extra=self._log_fields())
            else:
                log.error("client task failed: %s", exc, exc_info=exc, extra=self._log_fields())
            self.fatal = exc
            self._fatal_event.set()

    async def wait_fatal(self) -> BaseException:
        await self._fatal_event.wait()
        assert self.fatal is not None
        return self.fatal

    def cancel_round_tasks(self) -> None:
        for task in list(self._round):
            task.cancel()

    async def aclose(self) -> None:
        tasks = [*self._round, *self._long]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
