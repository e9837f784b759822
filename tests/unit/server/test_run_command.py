"""`psyche-server` options: every one explained; bad values are usage errors naming the option."""

from __future__ import annotations

import logging
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


def test_the_server_identity_is_made_once_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from psyche_common.protocol import Identity
    from psyche_server.run_command import load_server_identity

    path = tmp_path / "server.key"
    with caplog.at_level(logging.WARNING, logger="psyche.server"):
        made = load_server_identity(path)
    assert f"made a new one there (public key {made.public_key.hex()})" in caplog.text
    assert (path.stat().st_mode & 0o777) == 0o600
    caplog.clear()
    assert load_server_identity(path).public_key == made.public_key  # kept across restarts
    assert caplog.text == ""  # an existing key is no news
    assert load_server_identity(None).public_key != made.public_key  # no file: a new key
    path.write_text("not a key\n")
    with pytest.raises(click.BadParameter, match="64 hex characters"):
        load_server_identity(path)
    assert isinstance(made, Identity)


def test_a_new_server_key_needs_an_existing_directory(tmp_path: Path) -> None:
    """A typo in the key's directory is refused, not created along with a new identity."""
    from psyche_server.run_command import load_server_identity

    with pytest.raises(click.BadParameter, match=r"the directory .*keyz does not exist"):
        load_server_identity(tmp_path / "keyz" / "server.key")
    assert not (tmp_path / "keyz").exists()
