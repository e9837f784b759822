"""Cooldown: the model is shared for joiners, saved, pruned and (with --hub-repo) reported."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import psyche_client.model.loading as model_io
from psyche_client.app import ClientApp, ClientOptions
from psyche_client.training.backend import DummyBackend
from psyche_common.protocol import Identity


class RecordingLink:
    def __init__(self) -> None:
        self.checkpoints: list[dict] = []

    async def send_checkpoint(self, checkpoint: dict) -> None:
        self.checkpoints.append(checkpoint)


async def test_cooldown_shares_saves_prunes_and_reports(tmp_path: Path, monkeypatch) -> None:
    uploads: list[tuple[Path, str]] = []

    def fake_upload(directory, repo_id, token, message=None):
        uploads.append((Path(directory), repo_id))
        return "abc123"

    monkeypatch.setattr(model_io, "upload_to_hub", fake_upload)
    options = ClientOptions(
        server_addr="127.0.0.1:1",
        run_id="run",
        identity=Identity.generate(),
        checkpoint_dir=tmp_path,
        hub_repo="me/model",
        keep_checkpoints=2,
        dummy_training_delay_secs=0.0,
    )
    app = ClientApp(options)
    link = RecordingLink()
    app.server.uplink.attach(link)  # type: ignore[arg-type]
    backend = DummyBackend(0.0)
    for step in (5, 9, 13):
        coordinator = SimpleNamespace(progress=SimpleNamespace(step=step, epoch=step // 4))
        await app._cooldown(coordinator, backend)
    assert app.shared.manifest is not None and app.shared.manifest.step == 13
    assert app.shared.parameters == {"dummy.weights": backend.weights}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-step12", "run-step8"]
    assert (tmp_path / "run-step12" / "dummy.weights").read_bytes() == backend.weights
    assert [u[1] for u in uploads] == ["me/model"] * 3
    assert link.checkpoints[-1] == {"Hub": {"repo_id": "me/model", "revision": "abc123"}}
    app.shared.clear()
    assert app.shared.manifest is None
