"""Rules for `[model.LLM.optimizer]`: DisTrO's and SparseLoCo's fields beyond their types.

Errors: a chunk or top-k of 0; a `compression_decay` outside [0, 1] (the error feedback would
grow without bound or flip sign); a value format the table does not name clearly
(`value_format`: the older booleans contradicting each other, e.g. both `quantize_1bit` and
`quantize_2bit`, or contradicting `value_format`); for SparseLoCo, `inner_steps` of 0, `outer_lr` not above 0, betas
outside [0, 1), `eps` not above 0, a negative `weight_decay` or `clip_grad_norm`. Warning: a
SparseLoCo run whose starting global batch is smaller than `inner_steps` (each client splits
its samples into `inner_steps` parts, so some parts would be empty).
"""

from __future__ import annotations

from psyche_common.config.errors import ConfigProblem
from psyche_common.config.optimizer import DistroOptimizer, SparseLocoOptimizer
from psyche_common.config.state_file import StateFile
from psyche_common.config.value_format import ValueFormatConflict

_BASE = "model.LLM.optimizer"


def _problem(field: str, message: str) -> ConfigProblem:
    return ConfigProblem(field, message, "Optimizer")


def _compression_problems(
    base: str, optimizer: DistroOptimizer | SparseLocoOptimizer
) -> list[ConfigProblem]:
    problems = []
    for name in ("compression_chunk", "compression_topk"):
        if getattr(optimizer, name) == 0:
            problems.append(_problem(f"{base}.{name}", f"{base}.{name} must be at least 1"))
    if not 0.0 <= optimizer.compression_decay <= 1.0:
        problems.append(
            _problem(
                f"{base}.compression_decay",
                f"{base}.compression_decay ({optimizer.compression_decay}) must be between 0 and 1",
            )
        )
    return problems


def _value_format_problems(optimizer: DistroOptimizer | SparseLocoOptimizer) -> list[ConfigProblem]:
    try:
        optimizer.resolved_value_format()
    except ValueFormatConflict as conflict:
        return [_problem(conflict.field, conflict.message)]
    return []


def _sparseloco_problems(base: str, optimizer: SparseLocoOptimizer) -> list[ConfigProblem]:
    problems = []
    if optimizer.inner_steps == 0:
        problems.append(_problem(f"{base}.inner_steps", f"{base}.inner_steps must be at least 1"))
    if not optimizer.outer_lr > 0:
        problems.append(
            _problem(
                f"{base}.outer_lr",
                f"{base}.outer_lr ({optimizer.outer_lr}) must be greater than 0",
            )
        )
    if not all(0.0 <= beta < 1.0 for beta in optimizer.betas):
        problems.append(
            _problem(
                f"{base}.betas",
                f"{base}.betas {list(optimizer.betas)} must both be at least 0 and below 1",
            )
        )
    if not optimizer.eps > 0:
        problems.append(
            _problem(f"{base}.eps", f"{base}.eps ({optimizer.eps}) must be greater than 0")
        )
    for name in ("weight_decay", "clip_grad_norm"):
        value = getattr(optimizer, name)
        if value is not None and value < 0:
            problems.append(
                _problem(f"{base}.{name}", f"{base}.{name} ({value}) must not be negative")
            )
    return problems


def optimizer_problems(state: StateFile) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    """(errors, warnings) of the optimizer table."""
    optimizer = state.model.optimizer
    if isinstance(optimizer, DistroOptimizer):
        base = f"{_BASE}.Distro"
        return _compression_problems(base, optimizer) + _value_format_problems(optimizer), []
    if not isinstance(optimizer, SparseLocoOptimizer):
        return [], []
    base = f"{_BASE}.SparseLoCo"
    errors = (
        _compression_problems(base, optimizer)
        + _value_format_problems(optimizer)
        + _sparseloco_problems(base, optimizer)
    )
    warnings = []
    batch = state.config.global_batch_size_start
    if optimizer.inner_steps > batch:
        warnings.append(
            _problem(
                f"{base}.inner_steps",
                f"{base}.inner_steps ({optimizer.inner_steps}) is larger than "
                f"config.global_batch_size_start ({batch}): every client splits its samples "
                "into inner_steps parts, so some parts are empty and clients take fewer "
                "AdamW steps per round",
            )
        )
    return errors, warnings
