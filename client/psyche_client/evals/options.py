"""`EvalOptions`: what `psyche-client train --eval-*` asks the client to evaluate, and how often
(torch-free: the flag table and the options module import it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_EVAL_SEED = 42
"""The reference's `--eval-seed` default."""


def parse_task_list(value: object) -> tuple[str, ...]:
    """`--eval-tasks a,b` → ("a", "b") (blanks dropped; None or "" → no tasks)."""
    if value is None:
        return ()
    if isinstance(value, tuple | list):
        return tuple(str(v) for v in value)
    return tuple(name.strip() for name in str(value).split(",") if name.strip())


@dataclass(frozen=True)
class EvalOptions:
    """The `--eval-*` flags (see `app.flags`)."""

    tasks: tuple[str, ...] = ()
    """lm-eval task (or group) names; empty: no lm-eval tasks."""
    fewshot: int = 0
    seed: int = DEFAULT_EVAL_SEED
    """Seeds the choice of few-shot examples (lm-eval's `fewshot_random_seed`)."""
    max_docs: int | None = None
    """Documents of each task evaluated (lm-eval's `limit`; None: all)."""
    tasks_dir: Path | None = None
    """A folder of task YAML files read before lm-eval's own (its `include_path`)."""
    heldout_every: int = 0
    """A held-out loss every this many steps (0: never)."""
    heldout_sequences: int = 16
    """Sequences of the held-out split the held-out loss averages over."""
    batch_size: int = 4
    """Sequences per forward pass: the unit the eval holds the model for, between which
    training takes it back."""

    @property
    def enabled(self) -> bool:
        return bool(self.tasks) or self.heldout_every > 0

    def check(self) -> None:
        """Raise ValueError naming the flag at fault."""
        if self.fewshot < 0:
            raise ValueError(f"--eval-fewshot must be at least 0, got {self.fewshot}")
        if self.max_docs is not None and self.max_docs < 1:
            raise ValueError(f"--eval-task-max-docs must be at least 1, got {self.max_docs}")
        if self.heldout_every < 0:
            raise ValueError(f"--eval-heldout-every must be at least 0, got {self.heldout_every}")
        if self.heldout_sequences < 1 or self.batch_size < 1:
            raise ValueError("--eval-heldout-sequences and --eval-batch-size must be at least 1")
        if self.tasks_dir is not None and not self.tasks_dir.is_dir():
            raise ValueError(f"--eval-tasks-dir {self.tasks_dir} is not a directory")
