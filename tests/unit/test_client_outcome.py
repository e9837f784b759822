"""`app.outcome.first_to_end`: the client's main tasks run until the first ends; the others and
the background jobs are cancelled and awaited."""

from __future__ import annotations

import asyncio

from psyche_client.app.outcome import first_to_end


async def test_the_first_main_job_to_end_is_returned_and_the_rest_cancelled() -> None:
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def done_soon() -> str:
        await asyncio.sleep(0.01)
        return "finished"

    first = await first_to_end(
        {"server": done_soon(), "ticker": forever("ticker")}, background=[forever("evals")]
    )
    assert first.get_name() == "server"
    assert first.result() == "finished"
    assert sorted(cancelled) == ["evals", "ticker"]


async def test_a_background_job_that_ends_ends_nothing() -> None:
    async def quick() -> None:
        return None

    async def fails_later() -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("the server link failed")

    first = await first_to_end({"server": fails_later()}, background=[quick()])
    assert first.get_name() == "server"
    assert isinstance(first.exception(), RuntimeError)
