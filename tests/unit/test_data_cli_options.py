"""`psyche-data` options: every one explained; a bad value is a usage error naming it."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from psyche_common.data.cli import main


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_option_has_a_help_text(command: str) -> None:
    options = [param for param in main.commands[command].params if isinstance(param, click.Option)]
    assert options
    assert [option.name for option in options if not option.help] == []


@pytest.mark.parametrize("seed", ["zz", "1,2", "1,x"])
def test_a_bad_shuffle_seed_is_a_usage_error_naming_the_option(tmp_path: Path, seed: str) -> None:
    (tmp_path / "tokens.bin").write_bytes(bytes(64))
    result = CliRunner().invoke(
        main, ["inspect", str(tmp_path), "--seq-len", "4", "--index", "0", "--shuffle-seed", seed]
    )
    assert result.exit_code == 2
    assert "Invalid value for '--shuffle-seed'" in result.output
