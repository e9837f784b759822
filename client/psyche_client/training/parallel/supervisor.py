"""Rank 0's watch over the worker ranks: one command at a time, liveness, failure, exit.

A multi-device client cannot go on when one of its ranks dies, stops answering or disagrees
with rank 0. `Supervisor` detects it and ends the client with a message naming the rank:

* `command(cmd)` runs one command (broadcast + rank 0's share) under a lock; an exception
  other than `TrainingCancelled` marks the group failed, stops the workers and is raised as
  `ParallelFailure` (the round pipeline then ends the client with exit status 2);
* a watch thread, every 0.5 s: a worker this process started has exited; a worker's
  liveness stamp (`alive/<rank>`, written every `LIVENESS_INTERVAL` s by each worker) is older
  than the client's timeout (a frozen process); otherwise, when no command ran for
  `heartbeat_interval` s, it sends a `Heartbeat` so idle workers' waits never time out;
* after a failure the workers are stopped (SIGTERM, SIGCONT, then SIGKILL) at once. If no
  command is running, nothing else would notice, so the process exits with status 2 right
  away; if one is running, the pipeline gets `grace` seconds to end the client itself before
  the process exits.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from psyche_client.training.parallel.commands import Command, CommandChannel, Heartbeat
from psyche_client.training.parallel.launch import WorkerProcesses, describe_exit
from psyche_client.training.trainer import TrainingCancelled

log = logging.getLogger("psyche.client")

EXIT_STATUS = 2
LIVENESS_INTERVAL = 2.0
POLL_INTERVAL = 0.5


class ParallelFailure(RuntimeError):
    """A rank of this client died, hung or disagreed with rank 0; the client cannot go on."""


class Supervisor:
    def __init__(
        self,
        workers: WorkerProcesses | None,
        timeout: float,
        grace: float = 30.0,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self.workers = workers
        self.timeout = timeout
        self.grace = grace
        self.heartbeat_interval = max(1.0, min(30.0, timeout / 4))
        self.channel: CommandChannel | None = None
        self.failure: str | None = None
        self._exit_process = exit_process
        self._lock = threading.Lock()
        self._reported_at: float | None = None
        self._failed_at = 0.0
        self._last_command = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="parallel-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def attach(self, channel: CommandChannel) -> None:
        """Heartbeats and liveness checks start once the ranks have joined."""
        self.channel = channel

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    # ---- commands --------------------------------------------------------------------------
    @contextmanager
    def command(self, command: Command | None, what: str) -> Iterator[None]:
        """Run one command (`None`: rank 0's start-up, before any broadcast) exclusively."""
        with self._lock:
            if self.failure is not None:
                raise ParallelFailure(self.failure)
            try:
                if command is not None:
                    assert self.channel is not None
                    self.channel.send(command)
                yield
            except TrainingCancelled:
                raise
            except Exception as exc:
                message = self._diagnose(exc, what)
                self._fail(message)
                self._reported_at = time.monotonic()
                raise ParallelFailure(message) from exc
            finally:
                self._last_command = time.monotonic()

    # ---- watching --------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stopped.wait(POLL_INTERVAL):
            if self.failure is None:
                problem = self._dead_workers() or self._frozen_workers()
                if problem:
                    self._fail(problem)
                else:
                    self._heartbeat()
            if self.failure is not None and self._should_exit():
                log.error("stopping the client: %s", self.failure)
                for handler in logging.getLogger().handlers:
                    handler.flush()
                self._exit_process(EXIT_STATUS)
                return

    def _should_exit(self) -> bool:
        now = time.monotonic()
        if self._reported_at is not None:
            return now - self._reported_at >= self.grace
        if self._lock.acquire(blocking=False):  # no command running: nobody else will notice
            self._lock.release()
            return True
        return now - self._failed_at >= self.grace

    def _heartbeat(self) -> None:
        if self.channel is None or time.monotonic() - self._last_command < self.heartbeat_interval:
            return
        if not self._lock.acquire(blocking=False):
            return
        try:
            self.channel.send(Heartbeat())
        except Exception as exc:
            self._fail(self._diagnose(exc, "sending a heartbeat"))
        finally:
            self._last_command = time.monotonic()
            self._lock.release()

    def _dead_workers(self) -> str | None:
        if self.workers is None:
            return None
        exited = self.workers.exited()
        return "; ".join(describe_exit(*item) for item in exited) if exited else None

    def _frozen_workers(self) -> str | None:
        if self.channel is None:
            return None
        now = time.time()
        frozen = []
        for rank in range(1, self.channel.groups.world_size):
            stamp = self.channel.liveness(rank)
            if stamp is not None and now - stamp > self.timeout:
                frozen.append(f"rank {rank} has shown no sign of life for {now - stamp:.0f} s")
        return "; ".join(frozen) if frozen else None

    def _diagnose(self, exc: BaseException, what: str) -> str:
        """Name the rank at fault when possible (dead, frozen), else say what failed."""
        problem = self._dead_workers() or self._frozen_workers()
        if problem:
            return f"{problem} (while {what})"
        detail = f"{type(exc).__name__}: {exc}"
        if self.channel is None:
            return f"{what} failed: {detail}"
        reports = ", ".join(
            f"rank {rank}: {self.channel.progress(rank)}"
            for rank in range(1, self.channel.groups.world_size)
        )
        return f"{what} failed: {detail} (workers' last reports: {reports})"

    def _fail(self, message: str) -> None:
        if self.failure is not None:
            return
        self.failure = message
        self._failed_at = time.monotonic()
        log.error("multi-device client failed: %s", message)
        if self.workers is not None:
            self.workers.stop(grace=2.0)
