"""The flags the docs quote exist.

Every `--flag` README.md and docs/*.md mention, in a command line or in prose, must be a flag of
one of our commands or benches, or one of the few named below (another program's, or the
reference's where the docs say we lack it). Whether each command line uses only its own
command's flags is `test_docs_executable.py`. The click commands are read in-process (their
options, not their help text) and the benches' argparse flags from their source, so this runs
in about a second.
"""

from __future__ import annotations

import re
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


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_quoted_flag_exists(doc: Path) -> None:
    known = set().union(*program_flags().values(), *bench_flags().values(), OTHER_PROGRAMS)
    if doc.name == "deviations.md":
        known |= REFERENCE_ONLY
    unknown = [
        f"{doc.relative_to(ROOT)}:{number}: {flag}"
        for number, line in enumerate(doc.read_text().splitlines(), start=1)
        for flag in FLAG.findall(line)
        if flag not in known
    ]
    assert not unknown, "flags the docs quote that no command has:\n" + "\n".join(unknown)
