"""The `distro` variant: DisTrO (`distro.optimizer.DistroOptimizer`) driven by the trainer.

One step: the lookahead (`theta - prev_lr * sign(delta)`, only when this client's result of
the step before is still in flight: `distro.in_flight`), forward/backward over the whole
batch, clipping, then `generate` folds the gradient into
the momentum, minus the own result remembered from the step before (error feedback), and
compresses it. The study's variants of DisTrO (a momentum on the applied aggregate,
`DistroSettings.aggregate_momentum`; every coefficient kept) are settings of this one.
"""

from __future__ import annotations

from psyche_client.distro import Compressor, DistroOptimizer, DistroSettings, OwnResult
from psyche_client.distro.in_flight import OwnSteps
from psyche_client.training.optimizers.base import (
    NamedParameters,
    OptimizerSpec,
    Passes,
    SharedResults,
    StepOutcome,
    StepRequest,
)


class DistroTraining:
    name = "distro"

    def __init__(self, settings: DistroSettings, params: NamedParameters) -> None:
        self.optimizer = DistroOptimizer(params, settings)
        self._pending: list[OwnResult] = []
        self._own_steps = OwnSteps()  # which own result the lookahead anticipates

    @property
    def shared(self) -> SharedResults:
        return self.optimizer

    @property
    def verifier_compressor(self) -> Compressor:
        return self.optimizer.compressor

    def step(self, request: StepRequest, passes: Passes) -> StepOutcome:
        if request.zero_state:
            self.reset()
        lookahead_lr = self._own_steps.lookahead_lr(request.step, request.prev_lr)
        with self.optimizer.lookahead(lookahead_lr):
            done = passes.whole_batch()
        grad_norm = passes.clip()
        generated = self.optimizer.generate(
            request.lr,
            request.step,
            request.batch_id,
            request.nonce,
            self._pending,
            stats=request.measure,
        )
        self._pending = [generated.own]
        self._own_steps.trained(request.step)
        return StepOutcome(
            done.loss,
            generated.transmit,
            grad_norm,
            done.micro_batches,
            done.skipped,
            generated.stats,
        )

    def reset(self) -> None:
        self.optimizer.zero_momentum()
        self._pending.clear()
        self._own_steps.reset()

    def drop_pending(self) -> None:
        self._pending.clear()


DISTRO = OptimizerSpec(
    name="distro",
    config_kind="Distro",
    settings_type=DistroSettings,
    from_config=DistroSettings.from_config,
    build=DistroTraining,
)
