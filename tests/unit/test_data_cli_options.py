"""`psyche-data`: every option of every subcommand has a help text."""

from __future__ import annotations

import click
import pytest
from psyche_common.data.cli import main


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_option_has_a_help_text(command: str) -> None:
    options = [param for param in main.commands[command].params if isinstance(param, click.Option)]
    assert options
    assert [option.name for option in options if not option.help] == []
