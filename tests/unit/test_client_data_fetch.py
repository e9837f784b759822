"""The client's data fetching: ClientApp builds one SampleFetcher from its options and reads
the run's data_location and max_seq_len from the coordinator state at the first fetch."""

from __future__ import annotations

from typing import Any

import pytest
from psyche_client.app import ClientApp, ClientOptions
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Coordinator, RunState
from psyche_common.data import RetryPolicy
from psyche_common.data.fetcher import SampleFetcher
from psyche_common.data.server_client import DataServerProvider
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in, ids


def make_app(**options: Any) -> ClientApp:
    return ClientApp(
        ClientOptions.from_flags(
            {"server_addr": "127.0.0.1:1", "run_id": "run", **options}, Identity.generate()
        )
    )


def state(data_location: Any, max_seq_len: int) -> Coordinator:
    """A round in training whose samples come from `data_location`, `max_seq_len` long."""
    model = {"data_location": data_location, "max_seq_len": max_seq_len}
    return coordinator_in(RunState.RoundTrain, ids(2), model=model)


async def test_the_client_fetches_through_a_sample_fetcher_with_its_policy() -> None:
    app = make_app(data_fetch_attempts=2, data_fetch_retry_delay=0.5)
    assert isinstance(app.fetcher, SampleFetcher)
    assert app.fetcher.policy == RetryPolicy(attempts=2, delay_step=0.5)
    app.coordinator = state("Dummy", 16)
    try:
        assert (await app.fetcher(BatchId(0, 1))).shape == (2, 16)
    finally:
        await app.fetcher.aclose()


async def test_server_locations_get_the_run_seq_len_id_and_the_client_identity() -> None:
    app = make_app()
    assert app.fetcher is not None
    app.coordinator = state({"Server": "127.0.0.1:20001"}, 64)
    provider = await app.fetcher.provider()
    try:
        assert isinstance(provider, DataServerProvider)
        assert provider.seq_len == 64 and provider.identity is app.identity
        assert provider.run_id == "run"  # the data server's handshake names the run
    finally:
        await app.fetcher.aclose()


def test_the_dummy_backend_trains_without_a_fetcher() -> None:
    assert make_app(dummy_training_delay_secs=0.0).fetcher is None


async def test_fetching_before_any_state_is_a_clear_error() -> None:
    app = make_app()
    assert app.fetcher is not None
    with pytest.raises(RuntimeError, match="no coordinator state yet"):
        await app.fetcher(BatchId(0, 0))
