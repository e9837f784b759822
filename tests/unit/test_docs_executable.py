"""The docs are executable: what README.md and docs/*.md quote exists.

- Every command line the docs quote names a program that pyproject.toml installs, an existing
  subcommand of it (nested groups followed down), and only flags that command has; each
  distinct (sub)command's `--help` is run once, in-process through click's `CliRunner` (the
  entry point's very `click` object, so it is what the installed program runs), and must exit
  0. Bench scripts (`bench/NAME.py`) may only use the argparse flags their source declares.
- Every log line the docs quote (inline code after `logs`, `prints`, `warns`, `says`,
  `exits:`, ...) comes from a string literal of our packages, placeholders aside.
- The sample output the docs show right after a `psyche-server validate-config --state FILE`
  block is what the command prints for that file.

What counts as a command line or a quoted log line, and how placeholders are read, is
`tests/support/docs_scan.py`'s docstring. Each failure names the doc and line, the command or
quote, and what is missing, e.g. `docs/client.md:95: psyche-client train: no flag --foo`.
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.support.docs_scan import (
    DOCS,
    ROOT,
    Command,
    code_text,
    commands,
    found_in,
    literal_pieces,
    log_quotes,
    program_entry_points,
    words_and_flags,
)


@cache
def program(name: str) -> click.Command:
    module, attribute = program_entry_points()[name].split(":")
    command = getattr(importlib.import_module(module), attribute)
    assert isinstance(command, click.Command), f"{name}'s entry point is not a click command"
    return command


@cache
def help_exit(name: str, path: tuple[str, ...]) -> tuple[int, str]:
    """Run `name *path --help` once; its exit code and output."""
    result = CliRunner().invoke(program(name), [*path, "--help"])
    return result.exit_code, result.output


def bench_flags(script: str) -> set[str] | None:
    path = ROOT / script
    if not path.is_file():
        return None
    declared = re.findall(r"add_argument\(\s*\"(--?[a-zA-Z0-9-]+)\"", path.read_text())
    return {*declared, "--help", "-h"}


def command_flags(command: click.Command) -> set[str]:
    flags = {"--help"}
    for param in command.params:
        if isinstance(param, click.Option):
            flags.update(param.opts, param.secondary_opts)
    return flags


def check_command(command: Command) -> list[str]:
    """What is wrong with one quoted command line (empty: nothing)."""
    where = command.where
    words, flags = words_and_flags(command.rest)
    if command.program.startswith("bench/"):
        known = bench_flags(command.program)
        if known is None:
            return [f"{where}: {command.program}: no such bench script"]
        return [
            f"{where}: {command.program}: no flag {flag}" for flag in flags if flag not in known
        ]
    if command.program not in program_entry_points():
        return [f"{where}: {command.program}: not a program pyproject.toml installs"]
    current: click.Command = program(command.program)
    path: list[str] = []
    for word in words:
        if not isinstance(current, click.Group):
            break
        sub = current.commands.get(word)
        if sub is None:
            name = " ".join([command.program, *path])
            return [
                f"{where}: {name} has no subcommand {word!r} (it has {sorted(current.commands)})"
            ]
        current, path = sub, [*path, word]
    name = " ".join([command.program, *path])
    if isinstance(current, click.Group) and not path:
        if not flags:  # the program named in prose or a diagram, not a command line
            return []
        if "--help" not in flags:
            return [f"{where}: {name}: flags {flags} but no subcommand"]
    code, output = help_exit(command.program, tuple(path))
    if code != 0:
        return [f"{where}: `{name} --help` exited {code}: {output[-300:]}"]
    known = command_flags(current)
    return [f"{where}: {name}: no flag {flag}" for flag in flags if flag not in known]


def test_the_scanner_finds_commands_and_log_lines() -> None:
    """The scanner itself, on a sample, so a broken pattern cannot pass quietly."""
    doc = ROOT / "docs" / "sample.md"
    sample = (
        "Run `psyche-server run --state s.toml --no-tui`; it prints `psyche-server listening on\n"
        "0.0.0.0:20000` and `psyche-server key HEX`.\n"
        "```sh\nRUN_ID=x .venv/bin/psyche-client train --server-addr A \\\n"
        "    --run-id R  # a --comment\nbench/client.py --skip-fetch | tee --x\n```\n"
        "```text\npsyche-client output --not-a-flag\n```\n"
        "```console\n$ psyche-data inspect d --seq-len 8\npsyche-data output\n```\n"
        "The client logs `could not load the model: … trying again`, then `model ready`.\n"
    )
    found = [(c.line, c.program, words_and_flags(c.rest)) for c in commands(doc, sample)]
    assert sorted(found) == [
        (1, "psyche-server", (["run"], ["--state", "--no-tui"])),
        (4, "psyche-client", (["train"], ["--server-addr", "--run-id"])),
        (6, "bench/client.py", ([], ["--skip-fetch"])),
        (12, "psyche-data", (["inspect", "d"], ["--seq-len"])),
    ]
    quotes = [(q.line, q.text) for q in log_quotes(doc, sample)]
    assert quotes == [
        (1, "psyche-server listening on 0.0.0.0:20000"),
        (2, "psyche-server key HEX"),
        (15, "could not load the model: … trying again"),
        (15, "model ready"),
    ]
    assert literal_pieces("relay: refused KEY (from IP): N pipes from 10.0.0.1 (--maximum M)") == [
        "relay",
        "refused",
        "from",
        "pipes from",
        "--maximum",
    ]
    code = "relay: refused \nrelay pipes open from \n not sent: no server connection"
    assert found_in("relay pipes open", code)
    assert found_in("Witness not sent", code)  # one word the program fills in
    assert not found_in("relay sockets closed", code)
    assert not found_in("the Witness not sent", code)


def test_a_wrong_command_is_named_with_its_place() -> None:
    doc = ROOT / "docs" / "sample.md"
    sample = (
        "```sh\npsyche-server run --state s.toml --no-such-flag\npsyche-server runn\n"
        "psyche-nothing run\nbench/nothing.py --x\n```\n"
    )
    problems = [p for c in commands(doc, sample) for p in check_command(c)]
    assert problems[0] == "docs/sample.md:2: psyche-server run: no flag --no-such-flag"
    assert problems[1].startswith("docs/sample.md:3: psyche-server has no subcommand 'runn'")
    assert problems[2:] == ["docs/sample.md:5: bench/nothing.py: no such bench script"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_quoted_commands_exist(doc: Path) -> None:
    problems = [problem for command in commands(doc) for problem in check_command(command)]
    assert not problems, "commands the docs quote that the programs lack:\n" + "\n".join(problems)


@cache
def _code() -> str:
    return code_text()


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_quoted_log_lines_come_from_the_code(doc: Path) -> None:
    code = _code()
    problems = [
        f"{quote.where}: `{quote.text}`: no string in the code holds {piece!r}"
        for quote in log_quotes(doc)
        for piece in literal_pieces(quote.text)
        if not found_in(piece, code)
    ]
    assert not problems, "log lines the docs quote that the code never writes:\n" + "\n".join(
        problems
    )


def test_the_sample_validate_config_output_is_what_it_prints() -> None:
    """A `sh` block whose only command is `psyche-server validate-config --state FILE` (a file
    of the repository) followed by an output block: that block is the command's output."""
    checked = 0
    for doc in DOCS:
        text = doc.read_text()
        pattern = (
            r"```sh\n(?:\.venv/bin/)?psyche-server validate-config --state (\S+)\n```\s*\n"
            r"```(?:text)?\n(.*?)```"
        )
        for match in re.finditer(pattern, text, re.S):
            state = ROOT / match.group(1)
            if not state.is_file():
                continue
            result = CliRunner().invoke(
                program("psyche-server"), ["validate-config", "--state", str(state)]
            )
            line = text.count("\n", 0, match.start(2)) + 1
            assert result.output == match.group(2), (
                f"{doc.relative_to(ROOT)}:{line}: the sample output differs from what "
                f"`psyche-server validate-config --state {match.group(1)}` prints:\n"
                f"{result.output}"
            )
            checked += 1
    assert checked >= 1, "the quickstart's validate-config sample output was not found"
