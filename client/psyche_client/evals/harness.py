"""Running lm-evaluation-harness tasks on a `ModelLM`, and the scores that come out.

Task names are lm-eval's own (its built-in task YAMLs, e.g. `arc_easy`, `hellaswag`) or
those of the YAML files in `--eval-tasks-dir` (lm-eval's `include_path`). The datasets they
name are read through Hugging Face `datasets`: a task whose `dataset_path` is a Hub id needs
the dataset in the local cache (the client sets no network access up for it); a task YAML with
`dataset_path: json` and `dataset_kwargs: {data_files: ...}` reads local files
(docs/client.md, "Evals").

lm-eval's own seeding of Python's, NumPy's and torch's global generators is switched off (the
client's training must not see its random state change); only the few-shot sampler is seeded
(`--eval-seed`). No bootstrap (no standard errors): it would start worker processes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psyche_client.evals.adapter import ModelLM

PRIMARY_METRICS = ("acc_norm", "acc", "exact_match", "f1", "mcc")
"""The metric a task's score is, the first of these it reports."""
NOT_SCORES = ("sample_len", "samples")
"""Numbers lm-eval reports beside the metrics (how many documents were evaluated)."""


@dataclass(frozen=True)
class TaskScores:
    """The scores of one eval: `metrics` (`task/metric` → value, every numeric metric) and
    `primary` (task → its main metric, the figure the dashboards and the server show)."""

    metrics: Mapping[str, float]
    primary: Mapping[str, float]


def scores_from_results(results: Mapping[str, Mapping[str, Any]]) -> TaskScores:
    """The numbers of lm-eval's `results["results"]` (`{task: {"acc,none": 0.5, ...}}`)."""
    metrics: dict[str, float] = {}
    primary: dict[str, float] = {}
    for task, values in sorted(results.items()):
        found: dict[str, float] = {}
        for key, value in values.items():
            name, _, _filter = str(key).partition(",")
            if name.endswith("_stderr") or name in NOT_SCORES or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                found.setdefault(name, float(value))
        for name, value in sorted(found.items()):
            metrics[f"{task}/{name}"] = value
        main = next((m for m in PRIMARY_METRICS if m in found), None)
        if main is not None:
            primary[task] = found[main]
    return TaskScores(metrics, primary)


def task_manager(
    tasks: Sequence[str], tasks_dir: Path | None, *, include_defaults: bool = True
) -> Any:
    """lm-eval's `TaskManager` that knows `tasks`: the tasks of `tasks_dir` alone when they
    are all there (indexing lm-eval's ~15,000 built-in task files takes tens of seconds),
    else those and lm-eval's own (`include_defaults`). Raises ValueError naming a task
    neither has."""
    from lm_eval.tasks import TaskManager

    include = None if tasks_dir is None else str(tasks_dir)
    if include is not None:
        local = TaskManager(include_path=include, include_defaults=False)
        if all(task in local.all_tasks for task in tasks):
            return local
    manager = TaskManager(include_path=include, include_defaults=include_defaults)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        where = f" or in {tasks_dir}" if tasks_dir is not None else ""
        raise ValueError(f"unknown eval task(s) {', '.join(unknown)}: not in lm-eval{where}")
    return manager


def run_tasks(
    lm: ModelLM,
    tasks: Sequence[str],
    fewshot: int,
    seed: int,
    max_docs: int | None,
    manager: Any,
) -> TaskScores:
    """Evaluate `tasks` (known to `manager`, a `task_manager`) with `lm` (blocking; from a
    worker thread)."""
    from lm_eval import simple_evaluate

    output = simple_evaluate(
        model=lm,
        tasks=list(tasks),
        num_fewshot=fewshot,
        limit=max_docs,
        bootstrap_iters=0,
        log_samples=False,
        task_manager=manager,
        random_seed=None,
        numpy_random_seed=None,
        torch_random_seed=None,
        fewshot_random_seed=seed,
    )
    if output is None:
        raise RuntimeError("lm-eval returned no results")
    return scores_from_results(output["results"])
