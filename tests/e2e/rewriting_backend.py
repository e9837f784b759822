"""`RewritingBackend`: the DisTrO backend of an attack client that sends something other than
the result it trained (its momentum and error feedback keep the trained one).

A subclass says what it sends instead in `rewrite`; the client puts it in the backend registry
(`Parts(backends=with_distro_backend(MyBackend))`). `relabelled` gives another result's values
and indices under our own step, batch and nonce, so the strict decode and the signed commitment
check pass (the commitment covers the step and the batch).
"""

from __future__ import annotations

from collections.abc import Callable

from psyche_client.distro.result import DistroResult
from psyche_client.training.backend import Samples, TrainedResult
from psyche_client.training.distro_backend import DistroBackend
from psyche_common.batch_id import BatchId


def relabelled(source: DistroResult, mine: DistroResult) -> DistroResult:
    """`source`'s values and indices under `mine`'s step, batch and nonce."""
    return DistroResult(
        mine.step, mine.batch_id, mine.trainer_nonce, source.value_kind, source.tensors
    )


class RewritingBackend(DistroBackend):
    """Trains as the DisTrO backend does, then publishes `rewrite`'s result."""

    def rewrite(self, mine: DistroResult, cancelled: Callable[[], bool]) -> DistroResult:
        """What to publish instead of `mine`, the result just trained (`mine` itself to
        publish it)."""
        raise NotImplementedError

    def train(
        self, step: int, batch: BatchId, samples: Samples | None, cancelled: Callable[[], bool]
    ) -> TrainedResult | None:
        output = super().train(step, batch, samples, cancelled)
        if output is None:
            return None
        mine = DistroResult.decode(output.payload, self.trainer.layout)
        sent = self.rewrite(mine, cancelled)
        if sent is mine:
            return output
        return TrainedResult(output.loss, sent.encode(), sent.data_hash(), output.tokens)
