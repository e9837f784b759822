"""A test-only client that trains against the run: it negates its gradients.

It is `psyche-client` with one change, its training backend (`Parts(backends=...)`): while it
trains, every gradient is negated as backward computes it, before it reaches the parameter's
`.grad`, so DisTrO folds only negated gradients into its momentum and every result it sends
points the other way from an honest one (the values it sends are the negation of what it would
send honestly). Negating is exact, and so is everything after it (accumulation, clipping), so
the optimizer sees exactly the honest gradients negated. Everything else (signatures,
announcements, blobs, witnessing, a verifier's recomputed gradient) is honest. Run it with
`psyche-client`'s arguments: `python tests/e2e/signflip_client.py train --server-addr ...`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.training.backend import Samples, TrainedResult
from psyche_client.training.distro_backend import DistroBackend
from psyche_client.weights.backends import with_distro_backend
from psyche_common.batch_id import BatchId


class SignFlipBackend(DistroBackend):
    """The DisTrO backend, training on negated gradients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.negating = False
        for parameter in self.trainer.model.parameters():
            if parameter.requires_grad:
                parameter.register_hook(self._negate)

    def _negate(self, grad: torch.Tensor) -> torch.Tensor | None:
        return -grad if self.negating else None

    def train(
        self, step: int, batch: BatchId, samples: Samples | None, cancelled: Callable[[], bool]
    ) -> TrainedResult | None:
        self.negating = True
        try:
            return super().train(step, batch, samples, cancelled)
        finally:
            self.negating = False


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(backends=with_distro_backend(SignFlipBackend)))


if __name__ == "__main__":
    main()
