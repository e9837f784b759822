"""`app.signals.run_until_signalled`: a signal cancels the client's main task, lets its
cleanup run, and gives exit code 0; without a signal the task's own code comes through, and
the handlers are gone afterwards. (SIGUSR1 stands in for SIGTERM/SIGINT here, so the test
runner's own handling of those is untouched; tests/e2e/test_client_stop.py sends the real
ones to a real client.)"""

from __future__ import annotations

import asyncio
import os
import signal

from psyche_client.app.signals import run_until_signalled


def test_a_signal_stops_the_job_after_its_cleanup_with_code_0() -> None:
    cleaned: list[str] = []

    async def job() -> int:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.01)  # cleanup may still await
            cleaned.append("closed")
        return 5

    async def main() -> int:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGUSR1)
        return await run_until_signalled(job(), signals=(signal.SIGUSR1,))

    assert asyncio.run(main()) == 0
    assert cleaned == ["closed"]
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # the handler was removed


def test_without_a_signal_the_jobs_code_comes_through() -> None:
    async def job() -> int:
        return 3

    assert asyncio.run(run_until_signalled(job(), signals=(signal.SIGUSR1,))) == 3


def test_cancelled_from_outside_it_stays_cancelled() -> None:
    async def main() -> bool:
        task = asyncio.ensure_future(
            run_until_signalled(asyncio.sleep(3600, result=0), signals=(signal.SIGUSR1,))
        )
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(main())
