"""Training settings from the run config's optimizer table: AdamW's, DisTrO's or SparseLoCo's.

`optimizer_settings(config)` turns the run config's optimizer variant (or already-built
settings) into `AdamWSettings`, `DistroSettings` or `SparseLocoSettings`, the frozen dataclasses
the `Trainer` and the optimizers take.
"""

from __future__ import annotations

from dataclasses import dataclass

from psyche_common.config import (
    AdamWOptimizer,
    AnyOptimizer,
    DistroOptimizer,
    SparseLocoOptimizer,
)

from psyche_client.distro.optimizer import DistroSettings
from psyche_client.distro.sparseloco import SparseLocoSettings


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


Settings = DistroSettings | SparseLocoSettings | AdamWSettings


def optimizer_settings(config: AnyOptimizer | Settings) -> Settings:
    """Our settings from the run config's optimizer variant (or already-built settings)."""
    match config:
        case DistroSettings() | SparseLocoSettings() | AdamWSettings():
            return config
        case SparseLocoOptimizer():
            return SparseLocoSettings.from_config(config)
        case DistroOptimizer():
            return DistroSettings.from_config(config)
        case AdamWOptimizer():
            return AdamWSettings.from_config(config)
        case _:
            raise ValueError(
                f"unsupported optimizer for training: {config!r} (need Distro, SparseLoCo or AdamW)"
            )
