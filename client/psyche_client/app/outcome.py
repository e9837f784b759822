"""How the client's run ends: its main tasks run until the first of them ends, and that task
gives the process's exit code."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping, Sequence
from typing import TypeAlias

from psyche_client.round.tasks import EndOfRun
from psyche_client.session.server_link import ServerLinkError

log = logging.getLogger("psyche.client")

Job: TypeAlias = Coroutine[object, object, object]


async def first_to_end(
    main: Mapping[str, Job], background: Sequence[Job] = ()
) -> asyncio.Task[object]:
    """Run the `main` jobs (each a task named by its key) and the `background` ones until the
    first main job ends; cancel all the others, wait for them, and return the one that
    ended (a background job ending ends nothing)."""
    tasks = [asyncio.create_task(job, name=name) for name, job in main.items()]
    others = [asyncio.create_task(job) for job in background]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*tasks, *others):
            task.cancel()
        await asyncio.gather(*tasks, *others, return_exceptions=True)
    return next(iter(done))


def exit_code(first: asyncio.Task[object]) -> int:
    """The exit code for the task that ended the client first (logging why): 0 the run
    finished (or its data ran out: `EndOfRun`), 1 the server link failed, 2 the client failed."""
    if first.cancelled():
        return 1
    error = first.exception()
    if first.get_name() == "fatal":
        fatal = first.result()
        error = fatal if isinstance(fatal, BaseException) else error
    if error is None:
        log.info("run finished; exiting")
        return 0
    if isinstance(error, EndOfRun):
        log.info("exiting: %s", error)
        return 0
    if isinstance(error, ServerLinkError):
        log.error("%s", error)
        return 1
    log.error("client failed: %s", error, exc_info=error)
    return 2
