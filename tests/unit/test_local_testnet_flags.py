"""`psyche-local-testnet start`'s options and `TestnetOptions` come from one table
(`flags.START_FLAGS`): every flag sets a field that exists, with the field's default; every
field has a flag; the click command declares exactly the table's flags; and a parsed command
line fills the options as the flags say."""

from __future__ import annotations

from pathlib import Path

import pytest
from psyche_local_testnet import testnet
from psyche_local_testnet.cli import main
from psyche_local_testnet.flags import START_FLAGS, start_options

from tests.support.flag_tables import declaration_mismatches, fields_without_flag, target_mismatches


def parsed(*args: str) -> dict[str, object]:
    with main.commands["start"].make_context("start", list(args)) as ctx:
        return dict(ctx.params)


def test_every_flag_target_is_a_field_with_its_default() -> None:
    assert target_mismatches(START_FLAGS, testnet.TestnetOptions(num_clients=1)) == []


def test_every_field_has_a_flag() -> None:
    options = testnet.TestnetOptions(num_clients=1)
    assert fields_without_flag(START_FLAGS, options, ("", "metrics"), set()) == []


def test_the_start_command_declares_exactly_the_tables_flags() -> None:
    start = main.commands["start"]
    assert declaration_mismatches(start, START_FLAGS, from_environment=False) == []


def test_no_flags_give_the_default_options() -> None:
    assert start_options(parsed("--num-clients", "3")) == testnet.TestnetOptions(num_clients=3)


def test_a_command_line_fills_the_options(tmp_path: Path) -> None:
    options = start_options(
        parsed(
            *("--num-clients", "4", "--no-tui", "--headless", "--write-log", "--log", "debug"),
            *("--allowed-to-kill", "2,3", "--server-command", "py server.py"),
            *("--eval-tasks", "arc_easy", "--eval-tasks-dir", str(tmp_path / ".")),
        )
    )
    assert (options.num_clients, options.tui, options.headless, options.write_log) == (
        4,
        False,
        True,
        True,
    )
    assert options.log_level == "debug" and options.allowed_to_kill == [2, 3]
    assert options.server_program == ["py", "server.py"]
    assert options.metrics.eval_tasks == "arc_easy"
    assert options.metrics.eval_tasks_dir == tmp_path.resolve()


def test_the_wandb_options_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_PROJECT", "proj")
    monkeypatch.setenv("NUM_CLIENTS", "9")  # the other options are not read from it
    options = start_options(parsed("--num-clients", "2"))
    assert options.metrics.wandb_project == "proj" and options.num_clients == 2
