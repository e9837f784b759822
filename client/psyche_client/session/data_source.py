"""Where the run's samples come from, read from the coordinator state the server sent."""

from __future__ import annotations

from psyche_common.coordinator import Coordinator
from psyche_common.data.fetcher import DataSource


def run_data_source(
    coordinator: Coordinator | None, run_id: str, server_key: bytes | None
) -> DataSource:
    """The run's data location and sample length from the latest coordinator state, with the
    run's id and the server's key (the data server's handshake names the one and proves the
    other). RuntimeError before the first state: the data location is not known yet."""
    if coordinator is None:
        raise RuntimeError("no coordinator state yet: the run's data_location is unknown")
    model = coordinator.model
    return DataSource(model.data_location, int(model.max_seq_len), run_id, server_key)
