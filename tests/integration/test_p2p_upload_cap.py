"""Model shares under an upload cap, between real P2P nodes on 127.0.0.1: the cap holds the
serving node's parameter uploads to its rate, and a round's blob still goes through at once
while the model is being shared."""

from __future__ import annotations

import asyncio
import os

import pytest
from psyche_client.p2p import download_model

from tests.integration.test_p2p_model_share import Swarm, make_model, swarm

pytestmark = pytest.mark.timeout(60)

__all__ = ["swarm"]  # the fixture, used by name below

RATE = 1_000_000.0  # bytes/s


async def test_the_upload_cap_paces_parameters_but_not_results(swarm: Swarm) -> None:
    model = make_model(count=8, size=100_000)
    total = sum(len(data) for data in model[1].values())
    holder = await swarm.add(model=model, max_upload_rate=RATE)
    joiner = await swarm.add()
    blob = os.urandom(300_000)
    blob_hash = holder.publish_blob(blob, step=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    sharing = asyncio.ensure_future(download_model(joiner, [holder.peer_id]))
    await asyncio.sleep(0.2)
    assert not sharing.done()
    fetch_started = loop.time()
    assert await joiner.fetch_blob(blob_hash, [holder.peer_id]) == blob
    blob_time = loop.time() - fetch_started
    download = await sharing
    elapsed = loop.time() - started
    assert download.parameters == model[1]
    # everything but the bucket's initial burst (0.2 s of the rate) waited for tokens
    assert elapsed >= (total - 0.2 * RATE) / RATE * 0.95, elapsed
    assert holder.shaper.bulk_bytes >= total
    # the result was not held behind the model share, and not capped: 300 kB at the cap
    # would take 0.3 s after every parameter chunk queued before it
    assert blob_time < elapsed / 2, (blob_time, elapsed)
    assert blob_time < 0.3, blob_time


async def test_without_a_cap_parameters_are_not_paced(swarm: Swarm) -> None:
    model = make_model(count=8, size=100_000)
    holder = await swarm.add(model=model)
    joiner = await swarm.add()
    loop = asyncio.get_running_loop()
    started = loop.time()
    download = await download_model(joiner, [holder.peer_id])
    assert download.parameters == model[1]
    assert loop.time() - started < 0.6  # the capped run above needs at least 0.6 s
    assert holder.shaper.rate is None
