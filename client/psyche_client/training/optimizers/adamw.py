"""The `adamw` variant: plain AdamW on every client, no compression and no results (central
or comparison runs, and the study's baseline); `AdamWSettings` are the knobs of
`OptimizerDefinition::AdamW`."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from psyche_common.config import AdamWOptimizer

from psyche_client.distro import DistroResult
from psyche_client.training.optimizers.base import (
    NamedParameters,
    OptimizerSpec,
    Passes,
    StepOutcome,
    StepRequest,
)


@dataclass(frozen=True)
class AdamWSettings:
    """The knobs of `OptimizerDefinition::AdamW`."""

    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    eps: float = 1e-8
    clip_grad_norm: float | None = 1.0

    @classmethod
    def from_config(cls, config: AdamWOptimizer) -> AdamWSettings:
        beta1, beta2 = config.betas
        return cls(
            (float(beta1), float(beta2)),
            float(config.weight_decay),
            float(config.eps),
            config.clip_grad_norm,
        )


class AdamWTraining:
    name = "adamw"
    shared = None
    verifier_compressor = None

    def verifier_point(
        self, along: DistroResult | None, lr: float
    ) -> contextlib.AbstractContextManager[None]:
        """Results are not checked by recomputing: the weights stay where they are."""
        return contextlib.nullcontext()

    def __init__(self, settings: AdamWSettings, params: NamedParameters) -> None:
        self._adamw = torch.optim.AdamW(
            [p for _, p in params],
            lr=0.0,
            betas=settings.betas,
            eps=settings.eps,
            weight_decay=settings.weight_decay,
        )

    def step(self, request: StepRequest, passes: Passes) -> StepOutcome:
        done = passes.whole_batch()
        grad_norm = passes.clip()
        for group in self._adamw.param_groups:
            group["lr"] = request.lr
        self._adamw.step()
        return StepOutcome(done.loss, None, grad_norm, done.micro_batches, done.skipped)

    def reset(self) -> None:
        """Nothing: AdamW's moments follow the weights it steps itself."""

    def drop_pending(self) -> None:
        """Nothing: AdamW shares no results."""


ADAMW = OptimizerSpec(
    name="adamw",
    config_kind="AdamW",
    settings_type=AdamWSettings,
    from_config=AdamWSettings.from_config,
    build=AdamWTraining,
)
