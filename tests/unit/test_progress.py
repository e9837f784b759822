"""Progress lines of the long waits (model download from peers, checkpoint save and upload):
periodic lines with bytes and rate, a last line, and no Hub progress bar in JSON logs."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub.utils import (
    are_progress_bars_disabled,
    disable_progress_bars,
    enable_progress_bars,
)
from huggingface_hub.utils import tqdm as hub_tqdm
from psyche_client.app.progress_bars import silence_progress_bars
from psyche_common.logs import setup_logging
from psyche_common.progress import TransferProgress, directory_bytes, report_progress

log = logging.getLogger("psyche.test.progress")


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict[str, Any]]]:
    keys = ("bytes_done", "bytes_total", "bytes_per_sec", "elapsed_s")
    return [
        (r.getMessage(), {k: getattr(r, k) for k in keys})
        for r in caplog.records
        if r.name == log.name
    ]


def test_a_line_every_interval_and_one_at_the_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=log.name)
    now = [100.0]
    progress = TransferProgress("fetching the model", 50_000_000, log, clock=lambda: now[0])
    for second in range(1, 13):  # 2 MB a second, told every second
        now[0] = 100.0 + second
        progress.update(second * 2_000_000)
    progress.finish(24_000_000)
    assert lines(caplog) == [
        (
            "fetching the model: 10.0 MB of 50.0 MB (20%), 2.0 MB/s",
            {
                "bytes_done": 10_000_000,
                "bytes_total": 50_000_000,
                "bytes_per_sec": 2_000_000,
                "elapsed_s": 5.0,
            },
        ),
        (
            "fetching the model: 20.0 MB of 50.0 MB (40%), 2.0 MB/s",
            {
                "bytes_done": 20_000_000,
                "bytes_total": 50_000_000,
                "bytes_per_sec": 2_000_000,
                "elapsed_s": 10.0,
            },
        ),
        (
            "fetching the model: done, 24.0 MB in 12 s (2.0 MB/s)",
            {
                "bytes_done": 24_000_000,
                "bytes_total": 50_000_000,
                "bytes_per_sec": 2_000_000,
                "elapsed_s": 12.0,
            },
        ),
    ]


def test_an_unknown_amount_reports_the_time(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=log.name)
    now = [0.0]
    progress = TransferProgress(
        "uploading c to the Hub repo o/n", 8_000_000, log, clock=lambda: now[0]
    )
    now[0] = 6.0
    progress.update(None)
    now[0] = 8.0
    progress.finish(None)
    assert [message for message, _ in lines(caplog)] == [
        "uploading c to the Hub repo o/n: 6 s so far of 8.0 MB",
        "uploading c to the Hub repo o/n: done, 8.0 MB in 8 s (1.0 MB/s)",
    ]


async def test_report_progress_measures_while_the_work_runs(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO, logger=log.name)
    target = tmp_path / "checkpoint"

    async def write() -> str:
        target.mkdir()
        for index in range(4):
            (target / f"part{index}").write_bytes(b"x" * 1000)
            await asyncio.sleep(0.05)
        return "saved"

    progress = TransferProgress("saving", None, log, interval=0.03)
    assert await report_progress(progress, lambda: directory_bytes(target), write()) == "saved"
    found = lines(caplog)
    assert len(found) >= 4 and found[-1][0].startswith("saving: done, 0.0 MB in 0 s")
    assert found[-1][1]["bytes_done"] == 4000
    assert all(fields["bytes_done"] <= 4000 for _, fields in found)

    async def fail() -> str:
        await asyncio.sleep(0.05)
        raise OSError("disk full")

    caplog.clear()
    with pytest.raises(OSError, match="disk full"):  # not wrapped in an exception group
        await report_progress(
            TransferProgress("saving", None, log, interval=0.03), lambda: 0, fail()
        )
    assert not any("done" in message for message, _ in lines(caplog))


def test_directory_bytes(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"2" * 5)
    assert directory_bytes(tmp_path) == 15
    assert directory_bytes(tmp_path / "missing") == 0


@pytest.fixture
def hub_bars() -> Any:
    """Restores the Hub's progress-bar switch (process-global) after the test."""
    disabled = are_progress_bars_disabled()
    yield
    (disable_progress_bars if disabled else enable_progress_bars)()


def json_log_output(capsys: pytest.CaptureFixture[str]) -> list[str]:
    setup_logging("json", stream=sys.stderr)
    try:
        for _ in hub_tqdm(range(3), desc="Downloading model.safetensors", file=sys.stderr):
            logging.getLogger("psyche.client").info("a line between bar updates")
    finally:
        setup_logging("console")
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_no_hub_progress_bar_in_json_logs(
    hub_bars: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    enable_progress_bars()
    assert not silence_progress_bars("console")  # console logs keep the Hub's bars
    output = json_log_output(capsys)
    assert any("Downloading" in line for line in output)  # what would garble the stream
    assert silence_progress_bars("json")
    output = json_log_output(capsys)
    assert len(output) == 3
    assert [json.loads(line)["msg"] for line in output] == ["a line between bar updates"] * 3
