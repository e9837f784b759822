"""Client statistics (reference §3.3): losses, step durations, tokens/s, efficiency, traffic,
the last checkpoint (or why it failed) and the latest eval scores.

Fed by the round pipeline (it lives with it, so the pipeline imports nothing from the app
around it); read by the dashboard, the JSON logs and the witness metadata. Durations are kept
in bounded windows of 16, like the reference.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.assignment import round_batch_size
from psyche_common.protocol.messages import MAX_EVAL_NAME_LENGTH, MAX_EVALS

from psyche_client.round.state import RoundState

WINDOW = 16
HELDOUT_LOSS = "heldout_loss"
"""The name the held-out loss is reported under, among the eval scores."""


@dataclass
class ClientStats:
    losses: list[tuple[int, float]] = field(default_factory=list)
    weights_hashes: dict[int, bytes] = field(default_factory=dict)
    applied_senders: set[bytes] = field(default_factory=set)
    applied_results: dict[int, int] = field(default_factory=dict)
    """How many results were applied to the weights at each step (the last 1000 steps)."""
    trained_rounds: list[tuple[int, float, float, int]] = field(default_factory=list)
    """(step, round start, training end, tokens) of every round this client trained in
    (monotonic seconds; the last 1000)."""
    step_durations: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    train_durations: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    results_announced: int = 0
    sync_status: str = "in sync"
    """"in sync", "out of sync: <cause>" or how the last resync went (dashboard, logs)."""
    resyncs: int = 0
    prepared_rounds: Counter[str] = field(default_factory=Counter)
    """How rounds prepared during RoundWitness turned out: adopt / keep apply / revert."""
    results_downloaded: int = 0
    bytes_downloaded: int = 0
    step: int = 0
    epoch: int = 0
    run_state: str = ""
    global_batch_tokens: int = 0
    total_tokens: int = 0
    last_checkpoint: str = ""
    """The newest checkpoint this client saved (with `@revision` once uploaded)."""
    checkpoint_error: str | None = None
    """Why the last Cooldown's checkpoint could not be saved or uploaded (None once one is)."""
    link_status: str = ""
    """How fast the last applied round's results arrived against the round time
    (`round.link_speed`; "" before any was measured)."""
    evals: dict[str, float] = field(default_factory=dict)
    """The latest score of each eval (`psyche_client.evals`): lm-eval task → its main metric,
    and `heldout_loss`."""
    eval_steps: dict[str, int] = field(default_factory=dict)
    """The step each of `evals` was measured at."""
    eval_history: list[tuple[int, str, float]] = field(default_factory=list)
    """(step, eval name, score) of every eval so far (the last 1000)."""
    _last_round_end: float | None = None

    def observe_state(self, coordinator: Coordinator) -> None:
        self.step = coordinator.progress.step
        self.epoch = coordinator.progress.epoch
        self.run_state = str(coordinator.run_state)
        round_ = coordinator.current_round()
        seq_len = coordinator.model.max_seq_len
        if round_ is not None:
            self.total_tokens = round_.data_index * seq_len
        self.global_batch_tokens = round_batch_size(coordinator, round_) * seq_len

    def round_finished(self, round_: RoundState) -> None:
        now = time.monotonic()
        loss = round_.mean_loss()
        if loss is not None:
            self.losses.append((round_.step, loss))
            del self.losses[:-1000]
        if round_.training_finished_at is not None:
            self.train_durations.append(round_.training_finished_at - round_.started_at)
            if round_.tokens_trained:
                self.trained_rounds.append(
                    (
                        round_.step,
                        round_.started_at,
                        round_.training_finished_at,
                        round_.tokens_trained,
                    )
                )
                del self.trained_rounds[:-1000]
        if self._last_round_end is not None:
            self.step_durations.append(now - self._last_round_end)
        self._last_round_end = now

    def result_announced(self) -> None:
        self.results_announced += 1

    def downloaded(self, size: int) -> None:
        self.results_downloaded += 1
        self.bytes_downloaded += size

    def checkpointed(self, path: str | None, revision: str | None, error: str | None) -> None:
        """Record a Cooldown's checkpoint: the directory saved (None when saving failed), its
        Hub revision if uploaded, and the error of the save or upload (None: it succeeded)."""
        if path is not None:
            self.last_checkpoint = path if revision is None else f"{path}@{revision}"
        self.checkpoint_error = error

    def record_evals(self, step: int, scores: dict[str, float]) -> None:
        """Scores measured on the weights the client had at `step`."""
        for name, value in scores.items():
            self.evals[name] = value
            self.eval_steps[name] = step
            self.eval_history.append((step, name, value))
        del self.eval_history[:-1000]

    def reported_evals(self) -> dict[str, float]:
        """The scores a witness report carries: at most `MAX_EVALS`, names cut to
        `MAX_EVAL_NAME_LENGTH` characters, finite values only (the held-out loss first, then
        the tasks by name)."""
        names = sorted(self.evals, key=lambda name: (name != HELDOUT_LOSS, name))
        reported: dict[str, float] = {}
        for name in names:
            value = self.evals[name]
            short = name[:MAX_EVAL_NAME_LENGTH]
            if math.isfinite(value) and short not in reported and len(reported) < MAX_EVALS:
                reported[short] = float(value)
        return reported

    def results_applied(self, step: int, count: int) -> None:
        self.applied_results[step] = count
        for old in sorted(self.applied_results)[:-1000]:
            del self.applied_results[old]

    def loss_at(self, step: int) -> float | None:
        """This client's mean loss at `step` (None: it trained nothing then)."""
        for at, loss in reversed(self.losses):
            if at == step:
                return loss
            if at < step:
                return None
        return None

    def applied(self, step: int, weights_hash: bytes) -> None:
        self.weights_hashes[step] = weights_hash

    @property
    def last_loss(self) -> float | None:
        return self.losses[-1][1] if self.losses else None

    @property
    def tokens_per_sec(self) -> float:
        total = sum(self.step_durations)
        if total <= 0:
            return 0.0
        return self.global_batch_tokens * len(self.step_durations) / total

    @property
    def efficiency(self) -> float:
        k = min(len(self.step_durations), len(self.train_durations))
        total = sum(list(self.step_durations)[-k:]) if k else 0.0
        if total <= 0:
            return 0.0
        return min(1.0, sum(list(self.train_durations)[-k:]) / total)

    def witness_metadata(self, step: int, weights_hash: bytes) -> dict[str, Any]:
        loss = self.last_loss
        return {
            "step": step,
            "loss": loss if loss is not None and math.isfinite(loss) else None,
            "tokens_per_sec": float(self.tokens_per_sec),
            "bandwidth_per_sec": 0.0,
            "efficiency": float(self.efficiency),
            "weights_hash": weights_hash,
            "evals": self.reported_evals(),
        }
