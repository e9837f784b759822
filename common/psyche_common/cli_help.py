"""`print-all-help --markdown`: every command's help of a click program in one markdown page
(the reference's `print-all-help`, used to generate its CLI docs).

`markdown_help(group, name)` renders the group and each of its commands, depth first: the
description, the usage line, the subcommands, and every option with its help (defaults and
choices as click shows them in `--help`). `print_all_help_command(group, name)` is the command
each program adds to its group.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import click


def _anchor(path: str) -> str:
    return path.replace(" ", "-")


def _commands(group: click.Group, path: str) -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group, info_name=path)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub_path = f"{path} {name}"
        yield sub_path, command
        if isinstance(command, click.Group):
            yield from _commands(command, sub_path)


def _section(path: str, command: click.Command, parent: click.Context | None) -> Iterator[str]:
    ctx = click.Context(command, info_name=path.rsplit(" ", 1)[-1], parent=parent)
    yield f"## `{path}`"
    yield ""
    if command.help:
        yield inspect.cleandoc(click.unstyle(command.help))
        yield ""
    pieces = command.collect_usage_pieces(ctx)
    yield f"**Usage:** `{path} {' '.join(pieces)}`".rstrip("` ") + "`"
    yield ""
    if isinstance(command, click.Group):
        names = [n for n in command.list_commands(ctx) if not command.get_command(ctx, n).hidden]  # type: ignore[union-attr]
        if names:
            yield "###### **Subcommands:**"
            yield ""
            for name in names:
                sub = command.get_command(ctx, name)
                short = sub.get_short_help_str(limit=200) if sub is not None else ""
                yield f"* `{name}` — {short}"
            yield ""
    records = [
        record
        for param in command.get_params(ctx)
        if (record := param.get_help_record(ctx)) is not None
    ]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    if arguments:
        yield "###### **Arguments:**"
        yield ""
        for argument in arguments:
            yield f"* `{argument.make_metavar(ctx)}`"
        yield ""
    if records:
        yield "###### **Options:**"
        yield ""
        for decl, text in records:
            yield f"* `{decl}` — {text}" if text else f"* `{decl}`"
        yield ""


def markdown_help(group: click.Group, name: str) -> str:
    """The help of `group` (the program `name`) and of all its commands, as markdown."""
    commands = [(name, group), *_commands(group, name)]
    lines = [
        f"# Command-Line Help for `{name}`",
        "",
        f"This document contains the help content for the `{name}` command-line program.",
        "",
        "**Command Overview:**",
        "",
    ]
    lines += [f"* [`{path}`↴](#{_anchor(path)})" for path, _ in commands]
    lines.append("")
    root = click.Context(group, info_name=name)
    for path, command in commands:
        lines += _section(path, command, None if command is group else root)
    return "\n".join(lines).rstrip() + "\n"


def print_all_help_command(group: click.Group, name: str) -> click.Command:
    """The `print-all-help` command of the program `name` whose group is `group`."""

    @click.command("print-all-help")
    @click.option(
        "--markdown",
        is_flag=True,
        help="print the help as markdown (the only format; required, as in the reference)",
    )
    def print_all_help(markdown: bool) -> None:
        """Print the help of every command, as one markdown document."""
        if not markdown:
            raise click.UsageError("print-all-help prints markdown only: pass --markdown")
        click.echo(markdown_help(group, name), nl=False)

    return print_all_help
