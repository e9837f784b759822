"""What the client does with its model at a Cooldown (reference §2.12): share it with late
joiners, save it as a checkpoint (keeping the newest few), and upload it to the Hub.

Every step that touches the model or the disk runs in a worker thread; the caller holds the
model lock.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from psyche_client.p2p.manifest import ModelManifest, parameter_info
from psyche_client.training.backend import TrainingBackend

log = logging.getLogger("psyche.client")


@dataclass
class SharedModel:
    """What this client serves to late joiners between a Cooldown and the next round."""

    manifest: ModelManifest | None = None
    parameters: dict[str, bytes] = field(default_factory=dict)
    weights_hash: bytes | None = None
    """The backend's weights hash when `manifest` was built (to know whether it is current)."""

    def clear(self) -> None:
        self.manifest = None
        self.parameters = {}
        self.weights_hash = None

    async def share(self, backend: TrainingBackend, step: int, epoch: int) -> None:
        """Serve `backend`'s current weights (and config) as of coordinator `step`."""
        weights_hash = backend.weights_hash()
        entries = await asyncio.to_thread(backend.export_parameters)
        # hashing every parameter's bytes is a full pass over the model: not on the event loop
        infos = await asyncio.to_thread(
            lambda: [parameter_info(n, dtype, shape, data) for n, dtype, shape, data in entries]
        )
        manifest = ModelManifest.build(
            step=step,
            epoch=epoch,
            parameters=infos,
            config_json=await asyncio.to_thread(backend.config_json),
        )
        self.parameters = {name: data for name, _, _, data in entries}
        self.manifest = manifest
        self.weights_hash = weights_hash

    def holds(self, backend: TrainingBackend) -> bool:
        """Whether the shared model is `backend`'s current weights."""
        return self.manifest is not None and self.weights_hash == backend.weights_hash()


async def save_checkpoint(
    backend: TrainingBackend, directory: Path, run_id: str, step: int, keep: int
) -> Path:
    """Save the model to `directory/{run_id}-step{step}` and keep only the newest `keep`
    checkpoints of the run; returns the new checkpoint's directory."""
    target = directory / f"{run_id}-step{step}"
    await asyncio.to_thread(backend.save_checkpoint, str(target))
    await asyncio.to_thread(prune_checkpoints, directory, run_id, keep)
    log.info("checkpoint saved to %s", target)
    return target


async def upload_checkpoint(target: Path, hub_repo: str, token: str | None, step: int) -> str:
    """Upload a saved checkpoint to the Hub repo `hub_repo`; returns the commit (revision)."""
    # looked up at call time: tests replace upload_to_hub
    from psyche_client.model import loading as model_io

    revision = await asyncio.to_thread(
        model_io.upload_to_hub, target, hub_repo, token, f"step {step}"
    )
    log.info("checkpoint uploaded to %s@%s", hub_repo, revision)
    return revision


def prune_checkpoints(directory: Path, run_id: str, keep: int) -> None:
    """Keep the newest ``keep`` ``{run_id}-step{N}`` directories."""
    steps = []
    for path in directory.glob(f"{run_id}-step*"):
        suffix = path.name.removeprefix(f"{run_id}-step")
        if path.is_dir() and suffix.isdigit():
            steps.append((int(suffix), path))
    for _, path in sorted(steps)[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
