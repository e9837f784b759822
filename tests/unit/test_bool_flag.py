"""Boolean options in the reference's form (`--tui false`) and click's (`--tui`, `--no-tui`)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from psyche_client.cli import check as client_check
from psyche_client.cli import train as client_train
from psyche_common.bool_flag import bool_flag
from psyche_local_testnet.cli import start as local_testnet_start
from psyche_server.run_command import run as server_run


@click.command()
@bool_flag("--tui", default=None, help="dashboard")
@bool_flag("--relay", default=True, show_default=True, help="relay")
@click.option("--state", default=None)
def sample(tui: bool | None, relay: bool, state: str | None) -> None:
    click.echo(f"{tui} {relay} {state}")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "None True None"),
        (["--tui"], "True True None"),
        (["--no-tui"], "False True None"),
        (["--tui", "false"], "False True None"),
        (["--tui", "FALSE"], "False True None"),
        (["--tui", "no"], "False True None"),
        (["--tui", "0"], "False True None"),
        (["--tui", "true"], "True True None"),
        (["--tui=false"], "False True None"),
        (["--tui", "--state", "s"], "True True s"),  # no value: the next option is not one
        (["--tui", "false", "--state", "s"], "False True s"),
        (["--relay", "false", "--tui", "on"], "True False None"),
        (["--no-relay"], "None False None"),
        (["--no-tui", "--tui"], "True True None"),  # the last one given wins
        (["--tui", "false", "--no-tui"], "False True None"),
    ],
)
def test_every_spelling_parses(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(sample, args)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tui", "maybe"], "'maybe' is not a valid boolean"),
        (["--no-tui=true"], "does not take a value"),
        (["--tui", "false", "extra"], "unexpected extra argument"),
    ],
)
def test_bad_spellings_are_refused_naming_the_value(args: list[str], message: str) -> None:
    result = CliRunner().invoke(sample, args)
    assert result.exit_code == 2
    assert message in result.output


def test_help_shows_both_forms() -> None:
    result = CliRunner().invoke(sample, ["--help"])
    assert "--tui [true|false] / --no-tui" in result.output
    assert "--relay [true|false] / --no-relay" in result.output


def test_a_slash_pair_is_refused() -> None:
    with pytest.raises(TypeError, match="positive name only"):
        bool_flag("--tui/--no-tui", default=True)(lambda tui: None)


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    path = tmp_path / "state.toml"
    path.write_text("")  # only has to exist: parsing the options reads nothing
    return path


def parse(command: click.Command, args: list[str]) -> dict[str, object]:
    """The values `command` would run with (nothing is run)."""
    with command.make_context(command.name or "cmd", list(args)) as ctx:  # it consumes args
        return dict(ctx.params)


SERVER = ["--state", "STATE"]
CLIENT = ["--server-addr", "127.0.0.1:1", "--run-id", "r"]
CASES: list[tuple[click.Command, list[str], str, bool | None]] = [
    (server_run, SERVER, "tui", None),
    (server_run, SERVER, "withdraw_on_disconnect", True),
    (server_run, SERVER, "relay", True),
    (local_testnet_start, ["--num-clients", "2"], "tui", True),
    (client_train, CLIENT, "grad_accum_in_fp32", False),
    (client_train, CLIENT, "activation_checkpointing", False),
    (client_train, CLIENT, "fsdp", False),
    (client_check, SERVER, "fsdp", False),
    (client_check, SERVER, "grad_accum_in_fp32", False),
]
"""(command, its required arguments, a boolean option, its default)."""


@pytest.mark.parametrize(
    ("command", "required", "name", "default"),
    CASES,
    ids=[f"{command.name}-{name}" for command, _, name, _ in CASES],
)
def test_the_programs_take_the_reference_form(
    state_file: Path, command: click.Command, required: list[str], name: str, default: object
) -> None:
    required = [str(state_file) if arg == "STATE" else arg for arg in required]
    flag = "--" + name.replace("_", "-")
    no_flag = "--no-" + name.replace("_", "-")
    assert parse(command, required)[name] == default
    assert parse(command, [*required, flag])[name] is True
    assert parse(command, [flag, "false", *required])[name] is False
    assert parse(command, [flag, "true", *required])[name] is True
    assert parse(command, [*required, f"{flag}=false"])[name] is False
    assert parse(command, [no_flag, *required])[name] is False
