"""The one interface the `Trainer` drives, whichever optimizer a run trains with.

A `TrainingOptimizer` owns everything one variant keeps between steps (DisTrO's momentum and
its own results in flight, SparseLoCo's error feedback and inner AdamW, plain AdamW's
moments) and decides what one training step does. The trainer owns the model, the samples and
the arithmetic every variant shares, and lends it for one step as `Passes`:

    outcome = optimizer.step(StepRequest(...), passes)
        # passes.whole_batch()   forward/backward over the step's samples (data-parallel sync)
        # passes.part(ids)       forward/backward over a part of them, this rank alone
        # passes.clip()          the global gradient-norm clip of the run's settings
    optimizer.shared            # the results it shares (None: it shares none, AdamW)
    optimizer.reset()           # the weights were replaced: forget the state built on them
    optimizer.drop_pending()    # the last own result was not published

Variants are registered by name in `optimizers.registry`, each as an `OptimizerSpec` in its
own module (docs/architecture.md, "Adding an optimizer variant").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
from psyche_common.batch_id import BatchId

from psyche_client.distro import Compressor, DistroResult, ResultLayout

NamedParameters = Sequence[tuple[str, torch.nn.Parameter]]


class OptimizerSettings(Protocol):
    """What the trainer reads of every variant's settings."""

    @property
    def clip_grad_norm(self) -> float | None: ...


@dataclass(frozen=True)
class StepRequest:
    """One `Trainer.train` call as the optimizer sees it."""

    batch_id: BatchId
    step: int
    lr: float
    prev_lr: float
    nonce: int
    """The trainer nonce the result carries."""
    zero_state: bool
    """Start this step from a zeroed optimizer state (`train(..., zero_optim=True)`)."""
    measure: bool
    """Measure the optimizer statistics of `--optim-stats-steps` at this step."""


@dataclass(frozen=True)
class Pass:
    """One forward/backward over some samples: the mean loss and its micro-batches."""

    loss: float
    micro_batches: int
    skipped: int


class Passes(Protocol):
    """What the trainer lends an optimizer for one step (gradients land in `p.grad`)."""

    @property
    def samples(self) -> torch.Tensor:
        """The step's input ids (this rank's share), `(n, seq_len)`."""
        ...

    def whole_batch(self) -> Pass:
        """Forward/backward over `samples`, meeting the other data-parallel ranks."""
        ...

    def part(self, input_ids: torch.Tensor) -> Pass:
        """Forward/backward over a part of `samples`, on this rank alone."""
        ...

    def clip(self) -> float | None:
        """Clip the gradients' global L2 norm to the settings' `clip_grad_norm`; the norm
        before clipping (None when the settings clip nothing)."""
        ...

    def zero_grad(self) -> None: ...


@dataclass(frozen=True)
class StepOutcome:
    loss: float
    result: DistroResult | None
    grad_norm: float | None
    micro_batches: int
    skipped_micro_batches: int
    stats: Mapping[str, float] = field(default_factory=dict)
    """Optimizer statistics measured at this step (`StepRequest.measure`)."""


class SharedResults(Protocol):
    """The compressed optimizer behind a variant whose results travel between clients."""

    compressor: Compressor

    @property
    def layout(self) -> ResultLayout: ...

    def apply(self, results: Sequence[DistroResult], lr: float) -> int:
        """Apply every client's results of one step (any order); how many were applied."""
        ...


class TrainingOptimizer(Protocol):
    """One optimizer variant, driven by the `Trainer` (see the module docstring)."""

    name: str

    @property
    def shared(self) -> SharedResults | None:
        """The results this optimizer shares and applies (None: it shares none)."""
        ...

    @property
    def verifier_compressor(self) -> Compressor | None:
        """Where a verifier compares a recomputed gradient with a result's signs (DisTrO's
        compressor); None when this optimizer's results are not checked that way."""
        ...

    def verifier_point(self, along: DistroResult | None, lr: float) -> AbstractContextManager[None]:
        """Move the weights, for the duration of the `with`, to the point a trainer whose
        published result of the step before is `along` trained at (DisTrO's lookahead, with
        the step before's `lr`); a verifier recomputes its batch there. A no-op where results
        are not checked (`verifier_compressor` None) or `along` is None."""
        ...

    def step(self, request: StepRequest, passes: Passes) -> StepOutcome: ...

    def reset(self) -> None:
        """Zero the state built on the weights and forget the own results in flight."""
        ...

    def drop_pending(self) -> None:
        """Forget the last own result (it was not published, so it stays in the state)."""
        ...


S = TypeVar("S", bound=OptimizerSettings)


@dataclass(frozen=True)
class OptimizerSpec(Generic[S]):
    """One registered variant: its settings, how they come from the run's optimizer table
    (`config_kind`, the `state.toml` variant; empty for a variant runs cannot choose, only
    code), and how the optimizer is built on the model's parameters (sorted by name)."""

    name: str
    config_kind: str
    settings_type: type[S]
    from_config: Callable[[Any], S]
    build: Callable[[S, NamedParameters], TrainingOptimizer]

    def matches(self, config: object) -> bool:
        """Whether `config` (a run's optimizer table or built settings) is this variant's."""
        if type(config) is self.settings_type:
            return True
        return bool(self.config_kind) and getattr(config, "kind", None) == self.config_kind

    def settings_for(self, config: object) -> S:
        """This variant's settings from `config` (settings already built pass through)."""
        if type(config) is self.settings_type:
            return config
        if not self.matches(config):
            raise ValueError(f"{config!r} is not a {self.name} optimizer")
        return self.from_config(config)
