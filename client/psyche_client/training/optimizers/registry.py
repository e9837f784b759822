"""The optimizer variants by name, and the run config's optimizer table -> the one to train.

As torchtitan registers its train specs, every variant is one `OptimizerSpec` in its own
module, listed once here; nothing else names the variants. `optimizer_spec(config)` finds the
variant of a run's optimizer table (`config.kind`) or of settings built in code (the study's);
`optimizer_settings(config)` and `build_optimizer(config, params)` go on from there.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from psyche_client.training.optimizers.adamw import ADAMW
from psyche_client.training.optimizers.base import (
    NamedParameters,
    OptimizerSettings,
    OptimizerSpec,
    TrainingOptimizer,
)
from psyche_client.training.optimizers.distro import DISTRO
from psyche_client.training.optimizers.sparseloco import SPARSELOCO

OPTIMIZERS = MappingProxyType({spec.name: spec for spec in (DISTRO, SPARSELOCO, ADAMW)})


def optimizer_spec(config: object) -> OptimizerSpec[Any]:
    """The variant of `config`: a run's optimizer table or settings already built."""
    for spec in OPTIMIZERS.values():
        if spec.matches(config):
            return spec
    tables = ", ".join(spec.config_kind for spec in OPTIMIZERS.values() if spec.config_kind)
    raise ValueError(f"unsupported optimizer for training: {config!r} (need {tables})")


def optimizer_settings(config: object) -> OptimizerSettings:
    """Our settings from the run config's optimizer variant (or already-built settings)."""
    settings: OptimizerSettings = optimizer_spec(config).settings_for(config)
    return settings


def build_optimizer(config: object, params: NamedParameters) -> TrainingOptimizer:
    """The optimizer of `config` on `params` (sorted by name)."""
    spec = optimizer_spec(config)
    return spec.build(spec.settings_for(config), params)
