"""`MetricsOptions`: the `--wandb-*` flags (`app.flags`), one section of `ClientOptions`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricsOptions:
    """Where the client's metrics go: a Weights & Biases run when `wandb_project` is set."""

    wandb_project: str | None = None
    wandb_run: str | None = None
    """The run's name (default: `{run_id}-{client short id}`)."""
    wandb_group: str | None = None
    wandb_entity: str | None = None

    @property
    def wandb(self) -> bool:
        return self.wandb_project is not None

    def run_name(self, run_id: str, client: str) -> str:
        return self.wandb_run or f"{run_id}-{client}"
