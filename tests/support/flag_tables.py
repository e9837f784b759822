"""Checks of a `psyche_common.flag_table` table against the options it fills and the click
command built from it (used by the client's, the server's and the testnet's option tests):
each returns the mismatches found, so a test asserts it returns nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import click
from psyche_common.flag_table import Flag


def field_of(options: object, target: str) -> tuple[object, dataclasses.Field[object]] | None:
    """The dataclass holding `target` (a dotted path below `options`) and that field; None
    when the path names no field."""
    *path, name = target.split(".")
    holder = options
    for part in path:
        holder = getattr(holder, part, None)
        if holder is None or not dataclasses.is_dataclass(holder):
            return None
    fields = {f.name: f for f in dataclasses.fields(holder)}  # type: ignore[arg-type]
    return (holder, fields[name]) if name in fields else None


def target_mismatches(flags: Iterable[Flag], options: object) -> list[str]:
    """Flags whose target names no field of `options` (default-built), or a field whose
    default differs from the flag's (converted) default."""
    found: list[str] = []
    for flag in flags:
        if flag.target is None:
            continue
        located = field_of(options, flag.target)
        if located is None:
            found.append(f"{flag.name}: no field {flag.target}")
            continue
        holder, field = located
        if flag.default is None or flag.required:
            continue
        expected = flag.convert(flag.default) if flag.convert else flag.default
        actual = getattr(holder, field.name)
        if actual != expected:
            found.append(f"{flag.name}: default {expected!r}, {flag.target} {actual!r}")
    return found


def fields_without_flag(
    flags: Iterable[Flag], options: object, sections: Sequence[str], not_flags: set[str]
) -> list[str]:
    """Fields of the `sections` of `options` ("" for its own fields; dataclass-valued fields
    are sections of their own, not fields) that no flag targets and `not_flags` does not
    name."""
    targets = {flag.target for flag in flags if flag.target is not None}
    found: list[str] = []
    for section in sections:
        holder = options
        for part in filter(None, section.split(".")):
            holder = getattr(holder, part)
        for field in dataclasses.fields(holder):  # type: ignore[arg-type]
            name = f"{section}.{field.name}" if section else field.name
            if dataclasses.is_dataclass(getattr(holder, field.name)):
                continue
            if name not in targets and name not in not_flags:
                found.append(name)
    return found


def declaration_mismatches(
    command: click.Command, flags: Sequence[Flag], *, from_environment: bool
) -> list[str]:
    """Where `command`'s options are not exactly the table's, in order, with its names and
    environment variables."""
    declared = [param.name for param in command.params]
    if declared != [flag.param for flag in flags]:
        return [f"declared {declared}, table {[flag.param for flag in flags]}"]
    found: list[str] = []
    for param, flag in zip(command.params, flags, strict=True):
        envvar = flag.envvar if from_environment else flag.env
        if flag.name not in param.opts or param.envvar != envvar:
            found.append(f"{flag.name}: {param.opts} {param.envvar!r}")
    return found
