"""Rules for `[model.LLM.lr_schedule]` beyond the reference's: no negative learning rate (an
error: the step would climb the loss), and a cosine schedule that ends before the run (a
warning: the cosine is not clamped, so past its `total_steps` the LR climbs back towards
`base_lr`, as in the reference; the reference's own consilience config ships one).
"""

from __future__ import annotations

from psyche_common.config.errors import ConfigProblem
from psyche_common.config.lr_schedule import CosineLR
from psyche_common.config.state_file import StateFile

_BASE = "model.LLM.lr_schedule"
_LR_FIELDS = (
    "base_lr",
    "warmup_init_lr",
    "final_lr",
    "cosine_decay_final_lr",
    "linear_decay_final_lr",
)


def lr_schedule_problems(state: StateFile) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    """(errors, warnings) of the LR schedule against the run."""
    schedule = state.model.lr_schedule
    base = f"{_BASE}.{schedule.kind}"
    errors = []
    for name in _LR_FIELDS:
        value = getattr(schedule, name, None)
        if isinstance(value, float | int) and value < 0:
            errors.append(
                ConfigProblem(
                    f"{base}.{name}",
                    f"{base}.{name} ({value}) must not be negative",
                    "LRSchedule",
                )
            )
    warnings = []
    run_steps = state.config.total_steps
    if (
        isinstance(schedule, CosineLR)
        and schedule.warmup_steps < schedule.total_steps < run_steps
        and schedule.final_lr != schedule.base_lr
    ):
        warnings.append(
            ConfigProblem(
                f"{base}.total_steps",
                f"{base}.total_steps ({schedule.total_steps}) ends before the run "
                f"(config.total_steps {run_steps}): the cosine is not clamped, so after step "
                f"{schedule.total_steps} the LR climbs back from final_lr towards base_lr "
                f"({schedule.base_lr}); set it to {run_steps} to decay over the whole run",
                "LRSchedule",
            )
        )
    return errors, warnings
