"""`print-all-help --markdown` (the reference's docs helper) on both programs: one markdown
page with a section per command and every option of each."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from psyche_client.cli import main as client_main
from psyche_server.cli import main as server_main


@pytest.mark.parametrize(
    ("group", "name"), [(client_main, "psyche-client"), (server_main, "psyche-server")]
)
def test_every_command_and_option_is_in_the_page(group: click.Group, name: str) -> None:
    result = CliRunner().invoke(group, ["print-all-help", "--markdown"])
    assert result.exit_code == 0, result.output
    page = result.output
    assert page.startswith(f"# Command-Line Help for `{name}`")
    for command_name, command in group.commands.items():
        assert f"## `{name} {command_name}`" in page
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert f"`{param.opts[-1]}" in page or f" {param.opts[-1]}" in page, (
                    command_name,
                    param.opts,
                )


def test_without_markdown_it_says_what_to_pass() -> None:
    result = CliRunner().invoke(server_main, ["print-all-help"])
    assert result.exit_code == 2 and "pass --markdown" in result.output
