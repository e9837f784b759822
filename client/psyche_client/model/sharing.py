"""What the client does with its model at a Cooldown (reference §2.12): share it with late
joiners, save it as a checkpoint (keeping the newest few), and upload it to the Hub.

Checkpoints are written atomically (`psyche_client.model.checkpoint_dir`).

Every step that touches the model or the disk runs in a worker thread; the caller holds the
model lock.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from psyche_client.model.checkpoint_dir import prune_checkpoints, write_checkpoint_dir
from psyche_client.p2p.manifest import ModelManifest, parameter_info
from psyche_client.training.backend import TrainingBackend

log = logging.getLogger("psyche.client")


@dataclass
class SharedModel:
    """What this client serves to late joiners between a Cooldown and the next round."""

    manifest: ModelManifest | None = None
    parameters: dict[str, bytes] = field(default_factory=dict)

    def clear(self) -> None:
        self.manifest = None
        self.parameters = {}

    async def share(self, backend: TrainingBackend, step: int, epoch: int) -> None:
        """Serve `backend`'s current weights (and config) as of coordinator `step`."""
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


async def save_checkpoint(
    backend: TrainingBackend, directory: Path, run_id: str, step: int, keep: int
) -> Path:
    """Save the model to `directory/{run_id}-step{step}` atomically (`checkpoint_dir`) and keep
    only the newest `keep` checkpoints of the run; returns the new checkpoint's directory.

    When the backend or the disk fails, no directory of that name is left behind and an
    earlier checkpoint of the same name is untouched."""

    def write(partial: Path) -> None:
        backend.save_checkpoint(str(partial))

    target = await asyncio.to_thread(write_checkpoint_dir, directory, run_id, step, write)
    log.info("checkpoint saved to %s", target)
    try:
        await asyncio.to_thread(prune_checkpoints, directory, run_id, keep)
    except OSError as exc:  # the new checkpoint is complete: an old one left over is harmless
        log.warning("could not prune the old checkpoints in %s: %s", directory, exc)
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
