"""`WandbSink`: a client's metrics in a Weights & Biases run (`--wandb-project`).

`WandbSink.open(options, run_id, client)` starts the run (`wandb.init`, seconds: the caller
runs it off the event loop) with the project, name, group and entity of the flags; the run's
mode is wandb's own (`WANDB_MODE`: online by default, `offline` writes the run under
`WANDB_DIR` for a later `wandb sync`). Online without credentials it raises
`MetricsStartError` at once, naming what to do, before anything else starts.

`log(step, values)` only queues: a worker thread hands each entry to `run.log` with the step
as the `step` metric (every metric is charted against it, so figures of an earlier step, an
eval finished late, still land at their step). A full queue drops the entry and an error of
wandb is logged, never raised: wandb cannot block or fail a round. `close()` drains the queue
and finishes the run, waiting for each at most `CLOSE_TIMEOUT` seconds.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Mapping
from typing import Protocol

from psyche_client.metrics.options import MetricsOptions
from psyche_client.metrics.sink import MetricsStartError

log = logging.getLogger("psyche.client")

QUEUE_SIZE = 4096
"""Entries waiting for the worker at most; more are dropped (and counted)."""

CLOSE_TIMEOUT = 30.0
"""Seconds `close` waits for the queued entries to be handed to wandb."""

OFFLINE_MODES = ("offline", "dryrun", "disabled")


class WandbRun(Protocol):
    """What the sink uses of a `wandb.Run` (tests pass a stand-in)."""

    def log(self, data: dict[str, float]) -> None: ...

    def finish(self) -> None: ...


_Entry = tuple[int, dict[str, float]] | None


class WandbSink:
    def __init__(self, run: WandbRun, queue_size: int = QUEUE_SIZE) -> None:
        self.run = run
        self.dropped = 0
        self.errors = 0
        self._queue: queue.Queue[_Entry] = queue.Queue(maxsize=queue_size)
        self._closed = False
        self._worker = threading.Thread(target=self._drain, name="wandb-sink", daemon=True)
        self._worker.start()

    @classmethod
    def open(cls, options: MetricsOptions, run_id: str, client: str) -> WandbSink:
        """Start the wandb run of `options` (blocking; see the module docstring)."""
        import wandb

        # wandb's own records stay in its debug.log, out of the client's logs
        logging.getLogger("wandb").propagate = False
        mode = wandb.setup().settings.mode
        if mode not in OFFLINE_MODES and not wandb.login(verify=False, prompt=False):
            raise MetricsStartError(
                "--wandb-project: wandb is online and has no credentials: set WANDB_API_KEY "
                "(or run `wandb login`), or set WANDB_MODE=offline to keep the run on disk"
            )
        try:
            run = wandb.init(
                project=options.wandb_project,
                name=options.run_name(run_id, client),
                group=options.wandb_group,
                entity=options.wandb_entity,
                config={"run_id": run_id, "client": client},
                settings=wandb.Settings(console="off", silent=True),
            )
            run.define_metric("step")
            run.define_metric("*", step_metric="step")
        except Exception as exc:  # wandb raises many kinds; say which and stop
            raise MetricsStartError(f"--wandb-project: wandb could not start: {exc}") from exc
        log.info(
            "wandb run started",
            # the run's own directory (what `wandb sync` takes), not its files/ folder
            extra={
                "wandb_mode": mode,
                "wandb_dir": os.path.dirname(run.dir),
                "wandb_run": run.name,
            },
        )
        return cls(run)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        if self._closed:
            return
        try:
            self._queue.put_nowait((step, dict(values)))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("wandb is too slow: %d metric entries dropped", self.dropped)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(None, timeout=CLOSE_TIMEOUT)
        except queue.Full:
            log.warning("wandb: the queued metrics could not all be sent before exit")
        self._worker.join(CLOSE_TIMEOUT)
        # online, finishing uploads what is left: bounded, so that exiting is too
        finisher = threading.Thread(target=self._finish, name="wandb-finish", daemon=True)
        finisher.start()
        finisher.join(CLOSE_TIMEOUT)
        if finisher.is_alive():
            log.warning(
                "wandb: the run did not finish within %.0f s; `wandb sync` on its directory "
                "uploads what is left",
                CLOSE_TIMEOUT,
            )

    def _finish(self) -> None:
        try:
            self.run.finish()
        except Exception as exc:
            log.warning("wandb: finishing the run failed: %s", exc)

    def _drain(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is None:
                return
            step, values = entry
            try:
                self.run.log({"step": step, **values})
            except Exception as exc:  # wandb's failure must not reach the round
                self.errors += 1
                if self.errors == 1 or self.errors % 100 == 0:
                    log.warning(
                        "wandb: logging step %d failed (%d failures so far): %s",
                        step,
                        self.errors,
                        exc,
                    )
