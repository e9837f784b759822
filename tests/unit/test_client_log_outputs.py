"""The `--logs` values the reference has besides tui/console/json: `tui-and-console` runs the
dashboard with the readable lines on stdout, `none` leaves the console silent (even Python's
last-resort handler) while `--write-log` still gets every record."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import psyche_client.tui.app as dashboard
import pytest
from psyche_client.app import ClientOptions, ServerOptions
from psyche_client.cli import _run
from psyche_common.protocol import Identity


@pytest.fixture(autouse=True)
def clean_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def options() -> ClientOptions:
    return ClientOptions(ServerOptions("127.0.0.1:9", "x"), Identity.generate())


def test_tui_and_console_runs_the_dashboard_with_lines_on_stdout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    ran: list[ClientOptions] = []

    def fake_dashboard(opts: ClientOptions, parts: object = None) -> int:
        ran.append(opts)
        logging.getLogger("psyche.client").info("a line while the dashboard runs")
        return 0

    monkeypatch.setattr(dashboard, "run_dashboard", fake_dashboard)
    assert _run(options(), "tui-and-console", None) == 0
    assert len(ran) == 1
    assert "INFO  psyche.client: a line while the dashboard runs" in stdout.getvalue()


def test_none_prints_nothing_and_write_log_gets_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_file = tmp_path / "client.jsonl"
    assert _run(options(), "none", log_file) == 1  # no server at 127.0.0.1:9
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    assert "127.0.0.1:9" in log_file.read_text()
