"""Cooldown: the model is shared for joiners, saved, pruned and (with --hub-repo) reported;
a failed save or upload is logged, shown on the dashboard and retried at the next Cooldown,
and never ends the client."""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import ClassVar

import httpx
import huggingface_hub
import psyche_client.training.model.loading as model_io
import pytest
from huggingface_hub import CommitInfo
from huggingface_hub.errors import HfHubHTTPError
from psyche_client.app import ClientApp, ClientOptions, ServerOptions
from psyche_client.training.backend import DummyBackend
from psyche_client.tui.app import client_tab_text
from psyche_client.tui.view import BandwidthMeter, build_view
from psyche_client.weights.backends import BackendOptions
from psyche_client.weights.lifecycle import CheckpointOptions
from psyche_common.config import HubCheckpoint
from psyche_common.coordinator import Coordinator, RunState
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in, ids
from tests.support.fakes import RecordingUplink


def cooldown_at(step: int) -> Coordinator:
    """The Cooldown that ends the round of `step - 1` in epoch `step // 4`."""
    return coordinator_in(RunState.Cooldown, ids(2), step=step, epoch=step // 4)


async def test_cooldown_shares_saves_prunes_and_reports(tmp_path: Path, monkeypatch) -> None:
    uploads: list[tuple[Path, str]] = []

    def fake_upload(directory, repo_id, token, message=None):
        uploads.append((Path(directory), repo_id))
        return "abc123"

    monkeypatch.setattr(model_io, "upload_to_hub", fake_upload)
    options = ClientOptions(
        ServerOptions("127.0.0.1:1", "run"),
        Identity.generate(),
        backend=BackendOptions(dummy_delay_secs=0.0),
        checkpointing=CheckpointOptions(tmp_path, "me/model", keep=2),
    )
    app = ClientApp(options)
    link = RecordingUplink()
    app.server.uplink.attach(link)  # type: ignore[arg-type]
    backend = DummyBackend(0.0)
    for step in (5, 9, 13):
        await app.lifecycle.cooldown(cooldown_at(step), backend)
    assert app.lifecycle.shared.manifest is not None and app.lifecycle.shared.manifest.step == 13
    assert app.lifecycle.shared.parameters == {"dummy.weights": backend.weights}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-step12", "run-step8"]
    assert (tmp_path / "run-step12" / "dummy.weights").read_bytes() == backend.weights
    assert [u[1] for u in uploads] == ["me/model"] * 3
    assert link.checkpoints[-1] == HubCheckpoint(repo_id="me/model", revision="abc123")
    app.lifecycle.shared.clear()
    assert app.lifecycle.shared.manifest is None


class FailingSaveBackend(DummyBackend):
    """Saves like the dummy backend, except that while `error` is set it writes part of the
    checkpoint and then raises it (a full disk, a serialization error)."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.error: Exception | None = None

    def save_checkpoint(self, directory: str) -> None:
        if self.error is None:
            super().save_checkpoint(directory)
            return
        (Path(directory) / "model.safetensors").write_bytes(b"half a model")
        raise self.error


def make_app(tmp_path: Path, hub_repo: str | None = None) -> tuple[ClientApp, RecordingUplink]:
    options = ClientOptions(
        ServerOptions("127.0.0.1:1", "run"),
        Identity.generate(),
        backend=BackendOptions(dummy_delay_secs=0.0),
        checkpointing=CheckpointOptions(tmp_path, hub_repo, keep=2),
    )
    app = ClientApp(options)
    link = RecordingUplink()
    app.server.uplink.attach(link)  # type: ignore[arg-type]
    return app, link


async def cooldown(app: ClientApp, backend: DummyBackend, step: int) -> None:
    await app.lifecycle.cooldown(cooldown_at(step), backend)


def dashboard_text(app: ClientApp) -> str:
    return client_tab_text(build_view(app.snapshot(), BandwidthMeter()))


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("safetensors: serialization failed"),
    ],
    ids=["disk-full", "backend-error"],
)
async def test_a_failed_save_is_logged_shown_and_retried_at_the_next_cooldown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    app, _ = make_app(tmp_path)
    backend = FailingSaveBackend()
    await cooldown(app, backend, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-step4"]
    assert app.stats.checkpoint_error is None

    backend.error = error
    backend.weights = b"w" * 32
    with caplog.at_level(logging.ERROR, logger="psyche.client"):
        await cooldown(app, backend, 9)  # returns normally: the client trains on
    # the model is shared with late joiners all the same
    assert app.lifecycle.shared.manifest is not None and app.lifecycle.shared.manifest.step == 9
    assert app.lifecycle.shared.parameters == {"dummy.weights": b"w" * 32}
    # no half-written run-step8, no partial left behind, the previous checkpoint intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-step4"]
    assert (tmp_path / "run-step4" / "dummy.weights").read_bytes() != b"w" * 32
    [record] = [r for r in caplog.records if r.getMessage().startswith("checkpoint failed")]
    assert str(tmp_path / "run-step8") in record.getMessage()
    assert str(error) in record.getMessage()
    assert record.checkpoint_step == 8  # type: ignore[attr-defined]
    assert app.stats.checkpoint_error is not None and str(error) in app.stats.checkpoint_error
    assert app.stats.last_checkpoint == str(tmp_path / "run-step4")
    text = dashboard_text(app)
    assert f"Checkpoint error: could not save the checkpoint {tmp_path / 'run-step8'}" in text
    assert f"Last checkpoint: {tmp_path / 'run-step4'}" in text

    backend.error = None
    await cooldown(app, backend, 13)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-step12", "run-step4"]
    assert (tmp_path / "run-step12" / "dummy.weights").read_bytes() == b"w" * 32
    assert app.stats.checkpoint_error is None
    assert "Checkpoint error" not in dashboard_text(app)
    assert f"Last checkpoint: {tmp_path / 'run-step12'}" in dashboard_text(app)


async def test_an_unusable_checkpoint_dir_does_not_stop_the_cooldown(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    app, _ = make_app(blocker / "checkpoints")
    await cooldown(app, DummyBackend(0.0), 5)
    assert app.lifecycle.shared.manifest is not None and app.lifecycle.shared.manifest.step == 5
    assert app.stats.checkpoint_error is not None
    assert str(blocker / "checkpoints" / "run-step4") in app.stats.checkpoint_error


class FailingHubApi:
    """Stands in for `huggingface_hub.HfApi`: answers 503 while `failing`, then commits."""

    failing = True
    uploads: ClassVar[list[str]] = []

    def __init__(self, token: str | None = None) -> None:
        self.token = token

    def upload_folder(self, folder_path: str, repo_id: str, commit_message: str) -> CommitInfo:
        if FailingHubApi.failing:
            request = httpx.Request("POST", f"https://huggingface.co/api/models/{repo_id}/commit")
            raise HfHubHTTPError(
                "503 Server Error: Service Unavailable",
                response=httpx.Response(503, request=request),
            )
        FailingHubApi.uploads.append(folder_path)
        oid = f"rev-{Path(folder_path).name}"
        url = f"https://huggingface.co/{repo_id}/commit/{oid}"
        return CommitInfo(url, commit_message=commit_message, commit_description="", oid=oid)


async def test_a_failed_upload_is_logged_shown_and_retried_with_the_next_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(huggingface_hub, "HfApi", FailingHubApi)
    monkeypatch.setattr(FailingHubApi, "failing", True)
    monkeypatch.setattr(FailingHubApi, "uploads", [])
    app, link = make_app(tmp_path, hub_repo="me/model")
    backend = DummyBackend(0.0)
    with caplog.at_level(logging.ERROR, logger="psyche.client"):
        await cooldown(app, backend, 5)
    # saved but not uploaded, so nothing is reported to the coordinator
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-step4"]
    assert link.checkpoints == []
    [record] = [r for r in caplog.records if r.getMessage().startswith("checkpoint failed")]
    assert "me/model" in record.getMessage() and "503" in record.getMessage()
    error = app.stats.checkpoint_error
    assert error is not None and str(tmp_path / "run-step4") in error and "me/model" in error
    assert "Checkpoint error: could not upload" in dashboard_text(app)
    assert app.stats.last_checkpoint == str(tmp_path / "run-step4")

    FailingHubApi.failing = False
    await cooldown(app, backend, 9)
    assert FailingHubApi.uploads == [str(tmp_path / "run-step8")]
    assert link.checkpoints == [HubCheckpoint(repo_id="me/model", revision="rev-run-step8")]
    assert app.stats.checkpoint_error is None
    assert app.stats.last_checkpoint == f"{tmp_path / 'run-step8'}@rev-run-step8"
    assert "Checkpoint error" not in dashboard_text(app)
