"""The figures of one finished step, as the metric names a sink receives (pure).

`StepFigures` holds what the client knows of step S once the coordinator moved past it, and
`values()` names them: `train/loss` (the mean loss of this client's batches of S; absent when
it trained none), `train/lr`, `train/tokens_per_sec` (the run's, over the last steps),
`train/efficiency`, `train/total_tokens`, `train/applied_results` (results applied to the
weights at S: the consensus of step S-2), `p2p/bytes_up` and `p2p/bytes_down` (bytes this
client's P2P node sent and received during S) and their rates per second of the step,
`round/seconds` (how long S lasted as this client saw it), `coordinator/epoch` and
`coordinator/num_clients`. Every value is a finite float; a figure
the client does not have is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepFigures:
    step: int
    epoch: int
    num_clients: int
    lr: float | None
    loss: float | None
    tokens_per_sec: float
    efficiency: float
    total_tokens: int
    applied_results: int | None
    bytes_up: int
    bytes_down: int
    seconds: float | None
    """How long the step lasted as this client saw it (None: unknown)."""

    def values(self) -> dict[str, float]:
        figures: dict[str, float | None] = {
            "train/loss": self.loss,
            "train/lr": self.lr,
            "train/tokens_per_sec": self.tokens_per_sec,
            "train/efficiency": self.efficiency,
            "train/total_tokens": float(self.total_tokens),
            "train/applied_results": (
                None if self.applied_results is None else float(self.applied_results)
            ),
            "p2p/bytes_up": float(self.bytes_up),
            "p2p/bytes_down": float(self.bytes_down),
            "coordinator/epoch": float(self.epoch),
            "coordinator/num_clients": float(self.num_clients),
        }
        if self.seconds is not None and self.seconds > 0:
            figures["round/seconds"] = self.seconds
            figures["p2p/bytes_up_per_sec"] = self.bytes_up / self.seconds
            figures["p2p/bytes_down_per_sec"] = self.bytes_down / self.seconds
        return {
            name: float(value)
            for name, value in figures.items()
            if value is not None and math.isfinite(value)
        }
