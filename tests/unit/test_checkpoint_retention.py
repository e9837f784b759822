"""`--keep-steps` and `--delete-old-steps`: which of the run's checkpoint directories a
Cooldown deletes, and when (only after the new one is saved and uploaded)."""

from __future__ import annotations

from pathlib import Path

import psyche_client.training.model.loading as model_io
import pytest
from psyche_client.app import ClientApp, ClientOptions, ServerOptions
from psyche_client.app.flags import FLAGS
from psyche_client.training.backend import DummyBackend
from psyche_client.weights.backends import BackendOptions
from psyche_client.weights.lifecycle import CheckpointOptions
from psyche_common.coordinator import RunState
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in, ids
from tests.support.fakes import RecordingUplink


def make_app(tmp_path: Path, checkpointing: CheckpointOptions) -> ClientApp:
    options = ClientOptions(
        ServerOptions("127.0.0.1:1", "run"),
        Identity.generate(),
        backend=BackendOptions(dummy_delay_secs=0.0),
        checkpointing=checkpointing,
    )
    app = ClientApp(options)
    app.server.uplink.attach(RecordingUplink())  # type: ignore[arg-type]
    return app


async def cooldowns(app: ClientApp, *steps: int) -> None:
    backend = DummyBackend(0.0)
    for step in steps:
        await app.lifecycle.cooldown(
            coordinator_in(RunState.Cooldown, ids(2), step=step, epoch=step // 4), backend
        )


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_old_checkpoints_go_only_after_the_new_one_is_uploaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen_at_upload: list[list[str]] = []

    def fake_upload(directory, repo_id, token, message=None):  # type: ignore[no-untyped-def]
        seen_at_upload.append(names(tmp_path))
        return "rev"

    monkeypatch.setattr(model_io, "upload_to_hub", fake_upload)
    app = make_app(tmp_path, CheckpointOptions(tmp_path, "me/model", keep=1))
    await cooldowns(app, 5, 9, 13)
    # while step 12 was uploaded, step 8 (the latest before it) was still on disk
    assert seen_at_upload[-1] == ["run-step12", "run-step8"]
    assert names(tmp_path) == ["run-step12"]


async def test_no_delete_old_steps_keeps_every_checkpoint(tmp_path: Path) -> None:
    app = make_app(tmp_path, CheckpointOptions(tmp_path, keep=1, delete_old_steps=False))
    await cooldowns(app, 5, 9, 13)
    assert names(tmp_path) == ["run-step12", "run-step4", "run-step8"]


async def test_a_failed_upload_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_upload(directory, repo_id, token, message=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("hub down")

    app = make_app(tmp_path, CheckpointOptions(tmp_path, keep=1))
    await cooldowns(app, 5, 9)
    assert names(tmp_path) == ["run-step8"]
    monkeypatch.setattr(model_io, "upload_to_hub", failing_upload)
    app.lifecycle.checkpointing = CheckpointOptions(tmp_path, "me/model", keep=1)
    await cooldowns(app, 13)
    assert names(tmp_path) == ["run-step12", "run-step8"]


def test_the_flags_default_to_the_reference() -> None:
    by_name = {flag.name: flag for flag in FLAGS}
    assert by_name["--keep-steps"].default == 3
    assert by_name["--delete-old-steps"].default is True
    assert by_name["--hub-max-concurrent-downloads"].default == 3
    assert by_name["--keep-event-files"].default == 5
