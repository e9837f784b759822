"""The flags the docs quote exist.

Every command line in README.md and docs/*.md that starts with one of our programs
(`psyche-server run ...`, `.venv/bin/psyche-client train ...`, `bench/client.py ...`) may only
use flags of that very command, and every other `--flag` the docs mention must be a flag of one
of our commands or benches, or one of the few named below (another program's, or the
reference's where the docs say we lack it). The click commands are read in-process (their
options, not their help text) and the benches' argparse flags from their source, so this runs
in about a second.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from psyche_client.cli import main as client_main
from psyche_common.data.cli import main as data_main
from psyche_local_testnet.cli import main as local_testnet_main
from psyche_server.cli import main as server_main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS: dict[str, click.Group] = {
    "psyche-server": server_main,
    "psyche-client": client_main,
    "psyche-local-testnet": local_testnet_main,
    "psyche-data": data_main,
}

OTHER_PROGRAMS = {
    *("--standalone", "--nproc-per-node"),  # torchrun (docs/operations.md, docs/client.md)
    *("--rm", "--network", "--gpus", "--ipc", "--shm-size"),  # podman / docker run
    *("--variant", "--mode"),  # mmdebstrap (the container image's base)
    *("--durations", "--index-url"),  # pytest, pip (docs/client.md, "Running on a GPU")
}
"""Other programs' flags the docs quote."""

REFERENCE_ONLY = {
    "--sidecar-port",
    "--oltp-auth-header",
    "--oltp-tracing-url",
    "--oltp-logs-url",
    "--hf-token",
    "--optim-stats",
    "--optim-stats-steps",
    "--write-distro-data",
    "--eval-tasks",
    "--prompt-task",
}
"""The reference's flags that docs/deviations.md names as missing or not forwarded here."""

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w-])")  # not `--no-` (a prefix)
COMMAND = re.compile(
    r"(?:^|[\s`(/])(psyche-server|psyche-client|psyche-local-testnet|psyche-data) ([a-z-]+)"
    r"|(?:^|[\s`(])(bench/[a-z_]+\.py)"
)


def command_flags(command: click.Command) -> set[str]:
    flags: set[str] = set()
    for param in command.params:
        if isinstance(param, click.Option):
            flags.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
    return flags | {"--help"}


def program_flags() -> dict[tuple[str, str], set[str]]:
    """(program, subcommand) -> its flags."""
    return {
        (program, name): command_flags(command)
        for program, group in PROGRAMS.items()
        for name, command in group.commands.items()
    }


def bench_flags() -> dict[str, set[str]]:
    """bench/NAME.py -> its argparse flags (read from the source: the benches import torch)."""
    pattern = re.compile(r"add_argument\(\s*\"(--[a-z0-9-]+)\"")
    return {
        f"bench/{path.name}": set(pattern.findall(path.read_text())) | {"--help"}
        for path in sorted((ROOT / "bench").glob("*.py"))
    }


def command_lines(text: str) -> Iterator[tuple[str, str]]:
    """(`program subcommand` or `bench/x.py`, the rest of its command line) for every command
    in `text`: inline code spans and fenced blocks, backslash continuations joined, up to a
    comment, a pipe or the end of the span."""
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        yield from _commands(block.replace("\\\n", " "))
    for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
        yield from _commands(span.replace("\n", " "))


def _commands(text: str) -> Iterator[tuple[str, str]]:
    for line in text.splitlines():
        line = re.split(r"\s#|\||&&|;", line)[0]
        for match in COMMAND.finditer(line):
            rest = line[match.end() :]
            name = match.group(3) or f"{match.group(1)} {match.group(2)}"
            yield name, rest


def test_the_scan_sees_the_commands_and_flags() -> None:
    """The scanner itself: what it finds in a sample, so a broken pattern cannot pass."""
    sample = (
        "Run `psyche-server run --state s.toml --no-tui`.\n"
        "```sh\n.venv/bin/psyche-client train --server-addr A \\\n    --run-id R  # a --comment\n"
        "bench/client.py --skip-fetch | tee --x\n```\n"
    )
    found = sorted((name, FLAG.findall(rest)) for name, rest in command_lines(sample))
    assert found == [
        ("bench/client.py", ["--skip-fetch"]),
        ("psyche-client train", ["--server-addr", "--run-id"]),
        ("psyche-server run", ["--state", "--no-tui"]),
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_quoted_command_lines_use_only_their_command_flags(doc: Path) -> None:
    programs = program_flags()
    benches = bench_flags()
    problems = []
    for name, rest in command_lines(doc.read_text()):
        if name.startswith("bench/"):
            known = benches.get(name)
        else:
            program, subcommand = name.split(" ")
            known = programs.get((program, subcommand))
        flags = FLAG.findall(rest)
        if known is None:  # a log line such as `psyche-server listening on ...`, or a typo
            problems += [f"{name}: no such command" for _ in flags[:1]]
            continue
        problems += [f"{name} {flag}" for flag in flags if flag not in known]
    assert not problems, f"{doc.name} quotes flags its commands do not have: {problems}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_quoted_flag_exists(doc: Path) -> None:
    known = set().union(*program_flags().values(), *bench_flags().values(), OTHER_PROGRAMS)
    if doc.name == "deviations.md":
        known |= REFERENCE_ONLY
    unknown = sorted(set(FLAG.findall(doc.read_text())) - known)
    assert not unknown, f"{doc.name} quotes flags that no command has: {unknown}"
