"""Round states of the client pipeline (`psyche_client.round.state.RoundState`) for tests
that check one stage: a round this client only watches, and the downloads of its results."""

from __future__ import annotations

from psyche_client.round.roles import RoundRoles
from psyche_client.round.state import DownloadStatus, ResultDownload, RoundState
from psyche_client.training.backend import DecodedResult
from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom

from tests.support.fakes import unsigned_result


def observer_round(
    step: int, assignments: dict[BatchId, bytes], num_clients: int = 2, height: int = 1
) -> RoundState:
    """Round `step` in which this client trains, witnesses and verifies nothing; `assignments`
    name each batch's trainer."""
    roles = RoundRoles(
        step=step,
        height=height,
        my_index=None,
        committee_proof=None,
        witness_proof=None,
        selection=None,
        assignments=dict(assignments),
        batch_ids=tuple(sorted(assignments, key=lambda batch: batch.start)),
        my_batches=(),
    )
    return RoundState.start(roles, num_clients, True, 0.0, bloom_factory=lambda n: Bloom.random())


def downloaded(
    data_hash: bytes,
    trainer: bytes,
    batch: BatchId,
    result: DecodedResult | None = None,
    *,
    size: int = 0,
) -> ResultDownload:
    """The download of `trainer`'s result for `batch`: verified when `result` is given."""
    return ResultDownload(
        unsigned_result(trainer, batch, data_hash, size=size),
        batch,
        status=DownloadStatus.VERIFIED if result is not None else DownloadStatus.PENDING,
        result=result,
    )
