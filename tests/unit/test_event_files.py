"""Event files (`psyche_common.events`): one file per epoch, the newest `keep_files` kept, a
cut-off line skipped, a failed write never raised; `psyche-server observe` over them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from psyche_common.events.files import EventFileError, EventFileWriter
from psyche_common.events.render import render_timeline
from psyche_common.events.timeline import read_timeline
from psyche_server.cli import main as server_main


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def writer(root: Path, source: str = "coordinator", keep: int | None = 2) -> EventFileWriter:
    return EventFileWriter(root, source, {"run_id": "r", "version": "v"}, keep, clock=Clock())


def test_one_file_per_epoch_and_only_the_newest_kept(tmp_path: Path) -> None:
    events = writer(tmp_path, keep=2)
    events.write("x", {"n": 0})
    for epoch in (1, 2, 3):
        events.start_epoch(epoch)
        events.write("x", {"n": epoch})
    events.start_epoch(2)  # not later: same file
    events.write("x", {"n": 4})
    events.close()
    files = sorted(p.name for p in (tmp_path / "coordinator").iterdir())
    assert [name.split("-")[2] for name in files] == ["2", "3"]
    lines = [json.loads(line) for line in (tmp_path / "coordinator" / files[1]).open()]
    assert [line["kind"] for line in lines] == ["run_started", "x", "x"]
    assert lines[0]["run_id"] == "r" and lines[0]["source"] == "coordinator"
    assert [line.get("n") for line in lines[1:]] == [3, 4]


def test_files_of_other_processes_are_never_deleted(tmp_path: Path) -> None:
    (tmp_path / "coordinator").mkdir()
    stranger = tmp_path / "coordinator" / "events-epoch-0-2000-01-01T00-00-00Z.jsonl"
    stranger.write_text("")
    events = writer(tmp_path, keep=1)
    for epoch in (1, 2, 3):
        events.start_epoch(epoch)
    assert stranger.exists()
    assert len(list((tmp_path / "coordinator").iterdir())) == 2


def test_a_cut_off_line_is_skipped_and_counted(tmp_path: Path) -> None:
    events = writer(tmp_path, keep=None)
    events.write("coordinator", {"run_state": "Warmup", "epoch": 0, "step": 1, "clients": []})
    events.close()
    assert events.path is None
    file = next((tmp_path / "coordinator").iterdir())
    with file.open("a") as out:
        out.write('{"ts": 1800000009, "kind": "coor')  # a crash mid-line
    timeline = read_timeline(tmp_path)
    assert [e.kind for e in timeline.entries] == ["run_started", "coordinator"]
    assert timeline.sources["coordinator"].skipped == 1


def test_a_failed_write_is_logged_once_and_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    events = writer(tmp_path)

    class FullDisk:
        def write(self, _text: str) -> int:
            raise OSError(28, "No space left on device")

        def close(self) -> None:
            return None

    events._file = FullDisk()  # type: ignore[assignment]
    events.write("x")
    events.write("x")
    assert events.dropped == 2
    assert len([r for r in caplog.records if "later events are dropped" in r.message]) == 1


def test_an_unwritable_directory_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file where the directory should be")
    with pytest.raises(EventFileError, match="taken"):
        writer(tmp_path / "taken")


def test_the_timeline_tells_who_joined_and_left(tmp_path: Path) -> None:
    events = writer(tmp_path)
    for clients in (
        [["aa", "Healthy"]],
        [["aa", "Healthy"], ["bb", "Healthy"]],
        [["bb", "Dropped"]],
    ):
        events.write(
            "coordinator",
            {"run_state": "RoundTrain", "epoch": 0, "step": 3, "clients": clients},
        )
    lines = list(render_timeline(read_timeline(tmp_path).entries))
    assert lines[1].endswith("RoundTrain epoch 0 step 3, 1 client(s) (+aa)")
    assert lines[2].endswith("2 client(s) (+bb)")
    assert lines[3].endswith("1 client(s) (-aa, bb Healthy->Dropped)")


def test_observe_prints_every_source_merged_in_time_order(tmp_path: Path) -> None:
    clock = Clock()
    server = EventFileWriter(tmp_path, "coordinator", {"run_id": "r", "version": "s"}, clock=clock)
    client = EventFileWriter(tmp_path, "ab" * 32, {"run_id": "r", "version": "c"}, clock=clock)
    server.write("coordinator", {"run_state": "Warmup", "epoch": 0, "step": 1, "clients": []})
    client.write("step", {"step": 1, "figures": {"train/loss": 2.5, "round/seconds": 1.5}})
    server.write("coordinator", {"run_state": "Cooldown", "epoch": 0, "step": 2, "clients": []})
    runner = CliRunner()
    result = runner.invoke(server_main, ["observe", "--events-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary, timeline = result.output.split("\n\n", 1)
    assert "coordinator: 1 file(s), 3 event(s)" in summary and "abababab" in summary
    texts = [line.split("  ", 2)[2] for line in timeline.splitlines()]
    assert texts[2:] == [
        "Warmup epoch 0 step 1, 0 client(s)",
        "step 1 finished, loss 2.5, 1.5 s",
        "Cooldown epoch 0 step 2, 0 client(s)",
    ]
    only = runner.invoke(
        server_main, ["observe", "--events-dir", str(tmp_path), "--source", "abab", "--last", "1"]
    )
    assert only.exit_code == 0 and only.output.strip().endswith("1.5 s")
    assert "coordinator" not in only.output
    missing = runner.invoke(
        server_main, ["observe", "--events-dir", str(tmp_path), "--source", "ffff"]
    )
    assert missing.exit_code == 1 and "no such source" in missing.output
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = runner.invoke(server_main, ["observe", "--events-dir", str(empty)])
    assert nothing.exit_code == 1 and "holds no event files" in nothing.output
