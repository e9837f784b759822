"""What the client does with its model at a Cooldown (reference §2.12): share it with late
joiners, save it as a checkpoint (keeping the newest few), and upload it to the Hub.

Checkpoints are written atomically (`psyche_client.training.model.checkpoint_dir`). A failed save or
upload is a `CheckpointError`; `checkpoint_model` logs it and reports it in its outcome instead
of raising, so a full disk or a Hub outage never ends a training client.

Every step that touches the model or the disk runs in a worker thread; the caller holds the
model lock. Saving and uploading log progress every few seconds (`psyche_common.progress`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from psyche_common.progress import TransferProgress, directory_bytes, report_progress

from psyche_client.p2p.manifest import ModelManifest, parameter_info
from psyche_client.training.backend import TrainingBackend, shared_config_json
from psyche_client.training.model.checkpoint_dir import (
    CheckpointError,
    checkpoint_name,
    prune_checkpoints,
    write_checkpoint_dir,
)

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
            config_json=shared_config_json(backend.capabilities),
        )
        self.parameters = {name: data for name, _, _, data in entries}
        self.manifest = manifest
        self.weights_hash = weights_hash

    def adopt(
        self, manifest: ModelManifest, parameters: dict[str, bytes], weights_hash: bytes
    ) -> None:
        """Serve a model just fetched from peers (its vouched-for manifest and bytes, which
        `backend` now holds as `weights_hash`): a joiner answers later joiners' votes with
        the members' manifest instead of "not shared yet", and is one more source."""
        self.parameters = parameters
        self.manifest = manifest
        self.weights_hash = weights_hash

    def holds(self, backend: TrainingBackend) -> bool:
        """Whether the shared model is `backend`'s current weights."""
        return self.manifest is not None and self.weights_hash == backend.weights_hash()


async def save_checkpoint(
    backend: TrainingBackend, directory: Path, run_id: str, step: int
) -> Path:
    """Save the model to `directory/{run_id}-step{step}` atomically (`checkpoint_dir`);
    returns the new checkpoint's directory.

    Raises `CheckpointError` naming the checkpoint when the backend or the disk fails (a full
    disk, a read-only directory, ...): no directory of that name is then left behind, and an
    earlier checkpoint of the same name is untouched."""
    target = directory / checkpoint_name(run_id, step)
    partial_dir: list[Path] = []

    def write(partial: Path) -> None:
        partial_dir.append(partial)
        backend.save_checkpoint(str(partial))

    def written() -> int:
        """Bytes on disk so far: the partial directory until it is renamed to `target`."""
        return max(directory_bytes(partial_dir[-1]) if partial_dir else 0, directory_bytes(target))

    progress = TransferProgress(f"saving the checkpoint {target}", None, log)
    try:
        await report_progress(
            progress,
            written,
            asyncio.to_thread(write_checkpoint_dir, directory, run_id, step, write),
        )
    except Exception as exc:
        raise CheckpointError(
            f"could not save the checkpoint {target}: {type(exc).__name__}: {exc}"
        ) from exc
    log.info("checkpoint saved to %s", target)
    return target


async def delete_old_checkpoints(directory: Path, run_id: str, keep: int | None) -> None:
    """Keep the newest `keep` complete checkpoints of the run in `directory` (None: all of
    them; `--keep-steps`, `--delete-old-steps`) and remove leftover temporary directories.
    Called once the newest one is saved and uploaded, so neither it nor an upload in progress
    is ever removed. A failure is logged: an old checkpoint left over is harmless."""
    try:
        removed = await asyncio.to_thread(prune_checkpoints, directory, run_id, keep or 0)
    except OSError as exc:
        log.warning("could not delete the old checkpoints in %s: %s", directory, exc)
        return
    for path in removed:
        log.info("deleted the old checkpoint %s (--keep-steps %s)", path, keep)


async def upload_checkpoint(target: Path, hub_repo: str, token: str | None, step: int) -> str:
    """Upload a saved checkpoint to the Hub repo `hub_repo`; returns the commit (revision).

    Raises `CheckpointError` naming the directory and the repo when the upload fails."""
    try:
        # looked up at call time: tests replace upload_to_hub (and it imports torch)
        from psyche_client.training.model import loading

        progress = TransferProgress(
            f"uploading {target} to the Hub repo {hub_repo}", directory_bytes(target), log
        )
        revision = await report_progress(
            progress,
            lambda: None,  # the Hub client does not say how far it got: the elapsed time
            asyncio.to_thread(loading.upload_to_hub, target, hub_repo, token, f"step {step}"),
        )
    except CheckpointError:  # upload_to_hub's own error already names both
        raise
    except Exception as exc:
        raise CheckpointError(
            f"could not upload {target} to the Hub repo {hub_repo}: {type(exc).__name__}: {exc}"
        ) from exc
    log.info("checkpoint uploaded to %s@%s", hub_repo, revision)
    return revision


@dataclass(frozen=True)
class CheckpointOutcome:
    """What one Cooldown's checkpoint came to."""

    step: int
    path: Path | None
    """The checkpoint saved (None when saving failed)."""
    revision: str | None
    """The Hub commit it was uploaded as (None without `--hub-repo` or when that failed)."""
    error: str | None
    """Why saving or uploading failed (None when everything asked for succeeded)."""


async def checkpoint_model(
    backend: TrainingBackend,
    directory: Path,
    run_id: str,
    step: int,
    keep: int | None,
    hub_repo: str | None = None,
    token: str | None = None,
) -> CheckpointOutcome:
    """Save (and with `hub_repo` upload) the checkpoint of `step`, then keep only the newest
    `keep` of the run (None: keep all). A failure of the save or the upload (a full disk, a
    Hub error, anything the backend's save raises) is logged and returned, never raised: a
    training client must not die of it, and the next Cooldown tries again with its own
    checkpoint; old checkpoints are then left as they are."""
    path: Path | None = None
    try:
        path = await save_checkpoint(backend, directory, run_id, step)
        revision = await upload_checkpoint(path, hub_repo, token, step) if hub_repo else None
    except CheckpointError as exc:
        log.error(
            "checkpoint failed: %s (tried again at the next Cooldown)",
            exc,
            extra={"checkpoint_step": step, "error": str(exc)},
        )
        return CheckpointOutcome(step, path, None, str(exc))
    await delete_old_checkpoints(directory, run_id, keep)
    return CheckpointOutcome(step, path, revision, None)
