"""`--hub-max-concurrent-downloads`: a Hub checkpoint is fetched with snapshot_download's
`max_workers` set to it before the backend loads; local and `builtin:` models fetch nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import huggingface_hub
import psyche_client.training.model.loading as model_io
import pytest
from psyche_client.app import ClientApp, ClientOptions, ServerOptions
from psyche_client.weights.backends import BackendOptions
from psyche_common.coordinator import RunState
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in, ids


def test_download_hub_model_passes_the_worker_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    def fake_snapshot(**kwargs: Any) -> str:
        calls.append(kwargs)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    assert model_io.download_hub_model("owner/model", "main", 5) == tmp_path
    assert calls[0]["max_workers"] == 5
    assert calls[0]["repo_id"] == "owner/model" and calls[0]["revision"] == "main"


@pytest.mark.parametrize(
    ("repo_id", "fetched"), [("owner/model", True), ("builtin:llama-tiny", False)]
)
def test_the_lifecycle_fetches_only_hub_repos(
    repo_id: str, fetched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str | None, int]] = []
    monkeypatch.setattr(
        model_io, "download_hub_model", lambda *args: calls.append(args) or Path(".")
    )
    options = ClientOptions(
        ServerOptions("127.0.0.1:1", "run"),
        Identity.generate(),
        backend=BackendOptions(hub_max_concurrent_downloads=2),
    )
    coordinator = coordinator_in(RunState.Warmup, ids(2), checkpoint={"Hub": {"repo_id": repo_id}})
    ClientApp(options).lifecycle._fetch_hub_model(coordinator)
    assert calls == ([(repo_id, None, 2)] if fetched else [])
