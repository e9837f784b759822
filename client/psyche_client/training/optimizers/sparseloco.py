"""The `sparseloco` variant: SparseLoCo (`distro.sparseloco.SparseLocoOptimizer`) driven by
the trainer.

One step splits the samples into `inner_steps` equal parts and, inside
`SparseLocoOptimizer.local_round` (from the lookahead point of this client's result of the
step before, when that one is still in flight), takes one clipped AdamW step per part; the
result is then generated from the pseudo-gradient. The loss and gradient norm it reports are
the means over the parts.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from psyche_client.distro import DistroResult, OwnResult
from psyche_client.distro.sparseloco import SparseLocoOptimizer, SparseLocoSettings
from psyche_client.training.optimizers.base import (
    NamedParameters,
    OptimizerSpec,
    Passes,
    SharedResults,
    StepOutcome,
    StepRequest,
)


class SparseLocoTraining:
    name = "sparseloco"
    verifier_compressor = None

    def verifier_point(
        self, along: DistroResult | None, lr: float
    ) -> contextlib.AbstractContextManager[None]:
        """Results are not checked by recomputing: the weights stay where they are."""
        return contextlib.nullcontext()

    def __init__(self, settings: SparseLocoSettings, params: NamedParameters) -> None:
        self.optimizer = SparseLocoOptimizer(params, settings)
        self._pending: list[OwnResult] = []
        self._pending_step = 0  # the step `_pending` was trained for

    @property
    def shared(self) -> SharedResults:
        return self.optimizer

    def step(self, request: StepRequest, passes: Passes) -> StepOutcome:
        optimizer = self.optimizer
        if request.zero_state:
            optimizer.zero_state()
            self._pending.clear()
        parts = [
            part
            for part in torch.tensor_split(passes.samples, optimizer.settings.inner_steps)
            if part.shape[0]
        ]
        losses: list[float] = []
        norms: list[float] = []
        used = skipped = 0
        # only the own result of step - 1 is still in flight; an older one (this client
        # skipped a round) has already been applied or dropped by consensus
        in_flight = self._pending if self._pending_step == request.step - 1 else []
        with optimizer.local_round(in_flight):
            for part in parts:
                done = passes.part(part)
                losses.append(done.loss)
                used, skipped = used + done.micro_batches, skipped + done.skipped
                norm = passes.clip()
                if norm is not None:
                    norms.append(norm)
                optimizer.inner_step(request.lr)
                passes.zero_grad()
        generated = optimizer.generate(request.step, request.batch_id, request.nonce, self._pending)
        self._pending = [generated.own]
        self._pending_step = request.step
        return StepOutcome(
            loss=float(np.mean(losses)),
            result=generated.transmit,
            grad_norm=float(np.mean(norms)) if norms else None,
            micro_batches=used,
            skipped_micro_batches=skipped,
        )

    def reset(self) -> None:
        self.optimizer.zero_state()
        self._pending.clear()

    def drop_pending(self) -> None:
        self._pending.clear()


SPARSELOCO = OptimizerSpec(
    name="sparseloco",
    config_kind="SparseLoCo",
    settings_type=SparseLocoSettings,
    from_config=SparseLocoSettings.from_config,
    build=SparseLocoTraining,
)
