"""`ModelAccess`: the live model lent to an eval, one bounded piece of work at a time.

Evals run in a worker thread; each piece of work (one forward pass over a few sequences) is
run through `ModelAccess.run`, which first waits, on the event loop, until the round pipeline
says it would otherwise wait (`is_idle`: Cooldown, Warmup, or a round whose training is done)
and the pipeline's model lock is free, then holds that lock for the piece only. Training,
applying and sharing take the same lock, so they wait for at most one piece, and never see
the weights half-way through an eval.

The model is used as it is, never copied: in eval mode, without gradients, and put back in
the mode it was in. An eval is pinned to the weights it started on (their hash): when the
weights have changed between two pieces (a round applied its results) the eval is abandoned
with `WeightsChanged` and the caller starts it again on the new weights, so every score
belongs to one set of weights, and clients with equal weights get equal scores.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

import torch

from psyche_client.training.backend import TrainingBackend

T = TypeVar("T")

Run = Callable[[Callable[[torch.nn.Module], T]], T]
"""`ModelAccess.run`: `work(model)` on the live model, one piece at a time."""

POLL_SECONDS = 0.05
"""How often a waiting piece checks whether the pipeline is idle."""


class EvalCancelled(Exception):
    """The eval was stopped (the client is closing, or the model went away)."""


class WeightsChanged(EvalCancelled):
    """The weights changed during the eval: its score would mix two sets of weights."""


def live_model(backend: TrainingBackend) -> torch.nn.Module:
    """The backend's model (only a backend whose model lives in this process has one: the
    single-device DisTrO backend)."""
    model = backend.capabilities.live_model
    if model is None:
        raise EvalCancelled(
            f"evals need a model in this process; the {type(backend).__name__} backend has none"
        )
    return model()


class ModelAccess:
    """Lends the live model to eval work (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        lock: asyncio.Lock,
        is_idle: Callable[[], bool],
        backend_of: Callable[[], TrainingBackend | None],
        stop: threading.Event | None = None,
    ) -> None:
        self.loop = loop
        self.lock = lock
        self.is_idle = is_idle
        self.backend_of = backend_of
        self.stop = stop or threading.Event()
        self.pinned: bytes | None = None
        """The weights hash the current eval started on (set by its first piece)."""

    def begin(self) -> None:
        """A new eval starts: its first piece pins the weights."""
        self.pinned = None

    def run(self, work: Callable[[torch.nn.Module], T]) -> T:
        """`work(model)` on the live model once the pipeline is idle, under its model lock
        (call from a worker thread, never from the event loop)."""
        try:
            waiting = asyncio.run_coroutine_threadsafe(self._acquire(), self.loop)
        except RuntimeError as exc:  # the event loop is closed: the client is gone
            raise EvalCancelled("the client is closing") from exc
        backend = waiting.result()
        try:
            digest = backend.weights_hash()
            if self.pinned is None:
                self.pinned = digest
            elif digest != self.pinned:
                raise WeightsChanged("the weights changed during the eval")
            model = live_model(backend)
            was_training = model.training
            model.eval()
            try:
                with torch.no_grad():
                    return work(model)
            finally:
                model.train(was_training)
        finally:
            with contextlib.suppress(RuntimeError):  # a closed loop holds no lock any more
                self.loop.call_soon_threadsafe(self.lock.release)

    async def _acquire(self) -> TrainingBackend:
        """Wait until idle with the lock free, take the lock; the backend to use."""
        while True:
            if self.stop.is_set():
                raise EvalCancelled("the client is closing")
            if self.is_idle() and not self.lock.locked():
                await self.lock.acquire()
                backend = self.backend_of()
                if self.is_idle() and backend is not None:
                    return backend
                self.lock.release()
            await asyncio.sleep(POLL_SECONDS)
