"""A command's options written once, as a table: each `Flag` holds the option's name, click
type, default and help, and the options field it sets (`target`, a dotted path such as
"limits.max_frame_size"; None for the few the command handles itself).

`options(flags)` decorates a click command with the table's options, in order, and
`with_flags(base, flags, prefix, values)` fills one options section (a dataclass) from the
parsed values, so a flag and the field it sets cannot drift apart (each program has a test
that every target names a field with the flag's default). `psyche-client train`,
`psyche-server run` and `psyche-local-testnet start` are built this way. `PublicKeyType` is
the option type of a key the user pastes (`--server-key`, `--checkpointer`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from psyche_common.bool_flag import BoolFlag

F = TypeVar("F", bound=Callable[..., object])
T = TypeVar("T")

Callback = Callable[[click.Context, click.Parameter, Any], Any]


@dataclass(frozen=True)
class Flag:
    """One option of a command (see the module docstring)."""

    name: str
    help: str
    target: str | None = None
    default: object = None
    type: click.ParamType[Any, Any] | None = None
    required: bool = False
    is_flag: bool = False
    """A boolean option (`psyche_common.bool_flag.BoolFlag`): `--x`, `--x false`, `--no-x`."""
    switch: bool = False
    """A plain click switch: `--x` alone sets it, there is no value and no `--no-x`."""
    show_default: bool = False
    short: str | None = None
    convert: Callable[[object], object] | None = None
    """From the flag's value to the field's (None: the same)."""
    aliases: tuple[str, ...] = ()
    """Other long names of the option (e.g. the reference's spelling)."""
    dest: str | None = None
    """The Python name of the value, when not the one click derives from `name`."""
    env: str | None = None
    """The environment variable the option reads, when it has its own name."""
    multiple: bool = False
    callback: Callback | None = None
    metavar: str | None = None
    hidden: bool = False

    @property
    def param(self) -> str:
        """The Python name click gives the value (`--gossip-fanout` → `gossip_fanout`)."""
        return self.dest or self.name.removeprefix("--").replace("-", "_")

    @property
    def envvar(self) -> str:
        """The environment variable of the option: its own (`env`), else the upper-snake
        form of its name, used by commands that read every option from the environment."""
        return self.env or self.param.upper()

    def option(self, *, from_environment: bool = True) -> Callable[[F], F]:
        """The click decorator of this option. `from_environment`: every option may also be
        given as its `envvar` (else only those with an `env` of their own)."""
        decls = [*([self.short] if self.short else []), self.name, *self.aliases]
        if self.dest is not None:
            decls.append(self.dest)
        extra: dict[str, object] = {"show_default": True} if self.show_default else {}
        if self.is_flag:  # `--x`, `--x true|false` (the reference's form) and `--no-x`
            extra["cls"] = BoolFlag
        if self.switch:
            extra["is_flag"] = True
        for key in ("type", "callback", "metavar"):
            if getattr(self, key) is not None:
                extra[key] = getattr(self, key)
        if self.multiple:
            extra["multiple"] = True
        if self.hidden:
            extra["hidden"] = True
        envvar = self.envvar if from_environment else self.env
        if envvar is not None:
            extra["envvar"] = envvar
        default = False if self.switch and self.default is None else self.default
        return click.option(
            *decls,
            default=default,
            required=self.required,
            help=self.help,
            **extra,  # type: ignore[arg-type]
        )


if TYPE_CHECKING:
    _ParamType = click.ParamType[bytes, object]
else:
    _ParamType = click.ParamType  # generic only in click 8.3 and later


class PublicKeyType(_ParamType):
    """An ed25519 public key given as 64 hex characters (an optional `0x` before them); a
    value that is not one is refused naming `whose` key it should be and `where` to find it."""

    name = "HEX"

    def __init__(self, whose: str, where: str) -> None:
        self.whose = whose
        self.where = where

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> bytes:
        if isinstance(value, bytes):
            return value
        try:
            key = bytes.fromhex(str(value).strip().removeprefix("0x"))
        except ValueError:
            key = b""
        if len(key) != 32:
            self.fail(f"{value!r} is not {self.whose}: 64 hex characters, {self.where}", param, ctx)
        return key


def options(flags: Iterable[Flag], *, from_environment: bool = True) -> Callable[[F], F]:
    """A decorator adding every flag of `flags` to a click command, in the table's order."""
    table = list(flags)

    def decorate(command: F) -> F:
        for flag in reversed(table):
            command = flag.option(from_environment=from_environment)(command)
        return command

    return decorate


def section_values(
    flags: Iterable[Flag], section: str, values: Mapping[str, object] | None = None
) -> dict[str, object]:
    """The fields of `section` (a dotted prefix such as "backend.parallel"; "" for the top
    level) that `flags` set, from `values` by Python name (missing: the flag's default),
    converted. A None value leaves the field's default (a value its `convert` turns into None
    sets None: `--idle-timeout 0`, never)."""
    chosen: dict[str, object] = {}
    for flag in flags:
        if flag.target is None:
            continue
        prefix, _, name = flag.target.rpartition(".")
        if prefix != section:
            continue
        value = flag.default if values is None else values.get(flag.param, flag.default)
        if value is not None:
            chosen[name] = value if flag.convert is None else flag.convert(value)
    return chosen


def with_flags(
    base: T, flags: Iterable[Flag], section: str, values: Mapping[str, object] | None = None
) -> T:
    """`base` (a dataclass) with the fields the flags of `section` set."""
    return dataclasses.replace(base, **section_values(flags, section, values))  # type: ignore[type-var]


def default_of(cls: type, name: str) -> object:
    """The default of field `name` of the dataclass `cls` (so a table can take its defaults
    from the options type instead of repeating them); a field without one: KeyError."""
    for field in dataclasses.fields(cls):
        if field.name == name:
            if field.default is not dataclasses.MISSING:
                return field.default
            if field.default_factory is not dataclasses.MISSING:
                return field.default_factory()
            break
    raise KeyError(f"{cls.__name__}.{name} has no default")
