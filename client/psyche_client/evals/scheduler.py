"""`EvalScheduler`: when the client evaluates, on which weights, and where the scores go.

A long-lived task of the client app. Every `CHECK_SECONDS` while the round pipeline is idle
(`RoundRunner.is_idle`) it starts the eval that is due, in a daemon thread:

- the held-out loss (`--eval-heldout-every N`), when N steps have passed since the last one;
- the lm-eval tasks (`--eval-tasks`), whenever the weights differ from those last scored.

The thread reaches the model only through `ModelAccess` (one forward pass at a time, only while
the pipeline is idle, under its model lock), so an eval never delays a round; an eval whose
weights changed under it is abandoned and started again on the new weights. Scores go to the
client's statistics (the dashboard, and every witness report to the server), to the log, one
structured `eval scores` line per eval, and to `on_scores` if given. An eval that cannot run at all (no held-out split,
no tokenizer, an unknown task) is logged once and not tried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from psyche_common.coordinator import Coordinator

from psyche_client.evals.access import EvalCancelled, ModelAccess, WeightsChanged
from psyche_client.evals.heldout import NoHeldOutSplit, heldout_loss, heldout_sequences
from psyche_client.evals.options import EvalOptions
from psyche_client.evals.tokenizer import NoTokenizer, tokenizer_for
from psyche_client.round.runner import RoundRunner
from psyche_client.round.stats import HELDOUT_LOSS, ClientStats
from psyche_client.training.backend import TrainingBackend

log = logging.getLogger("psyche.client")

T = TypeVar("T")

CHECK_SECONDS = 0.25
"""How often the scheduler looks for an eval to start."""


@dataclass(frozen=True)
class EvalOutcome:
    """What one eval measured: `scores` (what the dashboards and the server get) and
    `metrics` (every figure, for the log), on the weights with hash `weights_hash`."""

    kind: str
    scores: dict[str, float]
    metrics: dict[str, float]
    weights_hash: bytes | None


async def in_daemon_thread(work: Callable[[], T]) -> T:
    """`work()` in a daemon thread (one the interpreter does not wait for at exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():
            setter(value)

    def target() -> None:
        try:
            outcome: tuple[Callable[[Any], None], Any] = (future.set_result, work())
        except BaseException as exc:
            outcome = (future.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=target, name="psyche-eval", daemon=True).start()
    return await future


class EvalScheduler:
    """Runs the evals of `options` on `runner`'s model (see the module docstring)."""

    def __init__(
        self,
        options: EvalOptions,
        stats: ClientStats,
        client_id: str,
        cache_dir: str | None = None,
        on_scores: Callable[[int, Mapping[str, float]], None] | None = None,
    ) -> None:
        self.options = options
        self.on_scores = on_scores
        """Also told every eval's figures (step, its `scores` and `metrics`): the metrics sink."""
        self.stats = stats
        self.client_id = client_id
        self.cache_dir = cache_dir
        self.stop = threading.Event()
        self.heldout_enabled = options.heldout_every > 0
        self.tasks_enabled = bool(options.tasks)
        self.last_heldout_step: int | None = None
        self.last_scored: bytes | None = None
        """The weights hash the lm-eval tasks last scored."""
        self.abandoned = 0
        """Evals abandoned because the weights changed under them."""
        self._checked_key: object = None
        self._manager: Any = None
        """lm-eval's task index, built by the first lm-eval eval (it can take seconds)."""

    async def run(
        self, runner: RoundRunner, coordinator_of: Callable[[], Coordinator | None]
    ) -> None:
        """Evaluate whenever an eval is due and the pipeline idle, until cancelled."""
        access = ModelAccess(
            asyncio.get_running_loop(),
            runner.ctx.model_lock,
            runner.is_idle,
            lambda: runner.backend,
            self.stop,
        )
        try:
            if self.tasks_enabled:  # lm-eval's import and task index: before any model work
                await self._attempt("lm-eval", access, self._index_tasks)
            while self.heldout_enabled or self.tasks_enabled:
                await asyncio.sleep(CHECK_SECONDS)
                coordinator = coordinator_of()
                backend = runner.backend
                if coordinator is None or backend is None or not runner.is_idle():
                    continue
                await self._evaluate_due(access, coordinator, backend, runner)
        except EvalCancelled:
            return
        finally:
            self.stop.set()

    async def _evaluate_due(
        self,
        access: ModelAccess,
        coordinator: Coordinator,
        backend: TrainingBackend,
        runner: RoundRunner,
    ) -> None:
        step = coordinator.progress.step
        every = self.options.heldout_every
        if self.heldout_enabled and (
            self.last_heldout_step is None or step - self.last_heldout_step >= every
        ):
            outcome = await self._attempt("heldout", access, self._heldout_job(coordinator))
            if outcome is not None:
                self.last_heldout_step = step
                self._record(step, outcome)
            return
        # the tasks run again only once the weights may have changed: a new model, epoch or
        # applied step
        applied = max(self.stats.weights_hashes, default=None)
        key = (id(backend), coordinator.progress.epoch, applied)
        if not self.tasks_enabled or key == self._checked_key:
            return
        self._checked_key = key
        outcome = await self._attempt("lm-eval", access, self._tasks_job(coordinator, backend))
        if outcome is not None:
            self._record(step, outcome)

    async def _attempt(
        self, kind: str, access: ModelAccess, job: Callable[[ModelAccess], EvalOutcome | None]
    ) -> EvalOutcome | None:
        """Run `job` in a thread; None when it was abandoned, skipped or cannot run."""
        access.begin()
        started = time.monotonic()
        try:
            outcome = await in_daemon_thread(lambda: job(access))
        except WeightsChanged:
            self.abandoned += 1
            log.debug("%s eval abandoned: the weights changed", kind, extra=self._fields())
            self._checked_key = None
            return None
        except EvalCancelled:
            raise
        except (NoHeldOutSplit, NoTokenizer, NotImplementedError, ValueError, OSError) as exc:
            log.error("%s evals disabled: %s", kind, exc, extra=self._fields())
            self._disable(kind)
            return None
        except Exception as exc:  # lm-eval's own failures: the client trains on without them
            log.error("%s evals disabled: %s", kind, exc, exc_info=exc, extra=self._fields())
            self._disable(kind)
            return None
        if outcome is not None:
            log.debug("%s eval took %.2f s", kind, time.monotonic() - started)
        return outcome

    def _disable(self, kind: str) -> None:
        if kind == "heldout":
            self.heldout_enabled = False
        else:
            self.tasks_enabled = False

    def _heldout_job(self, coordinator: Coordinator) -> Callable[[ModelAccess], EvalOutcome | None]:
        model = coordinator.model
        location, seq_len = model.data_location, int(model.max_seq_len)
        count, batch = self.options.heldout_sequences, self.options.batch_size

        def job(access: ModelAccess) -> EvalOutcome:
            sequences = heldout_sequences(location, seq_len, count, self.cache_dir)
            loss = heldout_loss(access.run, sequences, batch)
            scores = {HELDOUT_LOSS: loss}
            return EvalOutcome("heldout", scores, scores, access.pinned)

        return job

    def _tasks_job(
        self, coordinator: Coordinator, backend: TrainingBackend
    ) -> Callable[[ModelAccess], EvalOutcome | None]:
        options = self.options
        info = backend.capabilities.model_info
        config: dict[str, Any] = dict(info.config) if info is not None else {}
        files: list[Path] = list(info.tokenizer_files) if info is not None else []
        if info is not None and info.path is not None and (info.path / "tokenizer.json").is_file():
            files.append(info.path / "tokenizer.json")
        max_length = int(coordinator.model.max_seq_len)
        positions = config.get("max_position_embeddings")
        if isinstance(positions, int) and positions > 0:
            max_length = min(max_length, positions)

        def job(access: ModelAccess) -> EvalOutcome | None:
            from psyche_client.evals.adapter import ModelLM
            from psyche_client.evals.harness import run_tasks

            tokenizer = tokenizer_for(int(config.get("vocab_size", 0)), files)
            if self._manager is None:
                self._index_tasks(access)
            lm = ModelLM(access.run, tokenizer, max_length, options.batch_size)
            scores = run_tasks(
                lm, options.tasks, options.fewshot, options.seed, options.max_docs, self._manager
            )
            return EvalOutcome("lm-eval", dict(scores.primary), dict(scores.metrics), access.pinned)

        return job

    def _index_tasks(self, _access: ModelAccess) -> None:
        """Import lm-eval and index the tasks (no model needed: done once, up front; lm-eval
        is imported only here, in the eval thread, so a client without evals never loads it)."""
        from psyche_client.evals.harness import task_manager

        self._manager = task_manager(self.options.tasks, self.options.tasks_dir)

    def _record(self, step: int, outcome: EvalOutcome) -> None:
        if outcome.kind == "lm-eval":
            if outcome.weights_hash == self.last_scored:
                return  # the same weights scored again (a key changed, the weights did not)
            self.last_scored = outcome.weights_hash
        self.stats.record_evals(step, outcome.scores)
        if self.on_scores is not None:
            self.on_scores(step, {**outcome.scores, **outcome.metrics})
        log.info(
            "eval scores",
            extra=self._fields(
                step=step,
                eval_kind=outcome.kind,
                evals=outcome.scores,
                metrics=outcome.metrics,
                weights_hash=None if outcome.weights_hash is None else outcome.weights_hash.hex(),
            ),
        )

    def _fields(self, **extra: Any) -> dict[str, Any]:
        return {"client_id": self.client_id, **extra}
