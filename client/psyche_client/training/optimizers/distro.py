"""The `distro` variant: DisTrO (`distro.optimizer.DistroOptimizer`) driven by the trainer.

One step: the lookahead (`theta - prev_lr * sign(IDCT(r))`, `r` this client's own published
result of the step before, only while it is still in flight: `distro.in_flight`,
`distro.lookahead`), forward/backward over the whole
batch, clipping, then `generate` folds the gradient into
the momentum, minus the own result remembered from the step before (error feedback), and
compresses it. The study's variants of DisTrO (a momentum on the applied aggregate,
`DistroSettings.aggregate_momentum`; every coefficient kept) are settings of this one.
"""

from __future__ import annotations

import contextlib

from psyche_client.distro import (
    Compressor,
    DistroOptimizer,
    DistroResult,
    DistroSettings,
    OwnResult,
)
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
        self._published: dict[int, DistroResult] = {}
        """Step → the last result this client generated for it (what it publishes), for the
        last two steps it trained: the lookahead of step S moves along the one of S − 1."""

    @property
    def shared(self) -> SharedResults:
        return self.optimizer

    @property
    def verifier_compressor(self) -> Compressor:
        return self.optimizer.compressor

    def verifier_point(
        self, along: DistroResult | None, lr: float
    ) -> contextlib.AbstractContextManager[None]:
        """The lookahead a trainer whose published result of the step before is `along` made
        (`DistroOptimizer.lookahead`, the same code): a verifier recomputes there."""
        return self.optimizer.lookahead(lr, along)

    def step(self, request: StepRequest, passes: Passes) -> StepOutcome:
        if request.zero_state:
            self.reset()
        lookahead_lr = self._own_steps.lookahead_lr(request.step, request.prev_lr)
        along = self._published.get(request.step - 1)
        with self.optimizer.lookahead(lookahead_lr, along):
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
        self._published[request.step] = generated.transmit
        for old in [step for step in self._published if step < request.step - 1]:
            del self._published[old]
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
        self._published.clear()

    def drop_pending(self) -> None:
        """The last result was not published: it stays in the momentum, and nothing of ours
        is in flight for the next lookahead."""
        self._pending.clear()
        self._published.clear()


DISTRO = OptimizerSpec(
    name="distro",
    config_kind="Distro",
    settings_type=DistroSettings,
    from_config=DistroSettings.from_config,
    build=DistroTraining,
)
