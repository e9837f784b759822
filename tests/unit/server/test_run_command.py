"""`psyche-server` options: every one explained; bad values are usage errors naming the option."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from psyche_server.cli import main

EXAMPLE_STATE = Path(__file__).resolve().parents[3] / "state.toml.example"


@pytest.mark.parametrize(
    ("option", "value"), [("--log-level", "bogus"), ("--log-format", "xml"), ("-s", "70000")]
)
def test_bad_option_value_is_a_usage_error(option: str, value: str) -> None:
    result = CliRunner().invoke(main, ["run", "--state", str(EXAMPLE_STATE), option, value])
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.output


@pytest.mark.parametrize("command", ["run", "validate-config"])
def test_every_option_has_a_help_text(command: str) -> None:
    options = [param for param in main.commands[command].params if isinstance(param, click.Option)]
    assert options
    assert [option.name for option in options if not option.help] == []


def test_a_checkpointer_must_be_a_public_key() -> None:
    result = CliRunner().invoke(
        main, ["run", "--state", str(EXAMPLE_STATE), "--checkpointer", "abcd"]
    )
    assert result.exit_code == 2
    assert "Invalid value for '--checkpointer'" in result.output
    assert "64 hex characters" in result.output
