"""Boolean command-line options in both spellings: the reference's and click's.

The reference's programs take a boolean as a value (`--tui false`, `--withdraw-on-disconnect
true`); click's usual boolean flags take a pair of names (`--tui` / `--no-tui`). A `BoolFlag`
accepts all of them:

    --tui                   true
    --tui true|false        the value (also yes/no, on/off, 1/0, t/f, y/n; any case)
    --tui=false             the same
    --no-tui                false

so scripts written for the reference and those written for click's form both work. The value
is optional: `--tui` followed by another option, or by nothing, means true. Used by
`psyche-server run`, `psyche-client train` / `check` and `psyche-local-testnet start`.

API: `bool_flag(name, default=..., help=...)` (a click decorator), `BoolFlag` (the option class).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from click.parser import _OptionParser

F = TypeVar("F", bound=Callable[..., Any])

METAVAR = "[true|false]"


class BoolFlag(click.Option):
    """`--NAME [BOOL]` plus `--no-NAME` (see the module docstring). Built from one long
    option name; `secondary_opts` holds the `--no-` form, as for click's `--x/--no-x` flags."""

    def __init__(self, param_decls: list[str], **attrs: Any) -> None:
        if any("/" in decl for decl in param_decls):
            raise TypeError(f"BoolFlag {param_decls}: give the positive name only")
        attrs.update(type=click.BOOL, is_flag=False, flag_value=True, metavar=METAVAR)
        super().__init__(param_decls, **attrs)
        self.secondary_opts = [f"--no-{opt[2:]}" for opt in self.opts if opt.startswith("--")]

    def add_to_parser(self, parser: _OptionParser, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)  # `--NAME [VALUE]`
        parser.add_option(
            obj=self, opts=self.secondary_opts, dest=self.name, action="store_const", const=False
        )

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        positive = copy.copy(self)
        positive.secondary_opts = []
        record = click.Option.get_help_record(positive, ctx)
        if record is None:
            return None
        spec, text = record
        return f"{spec} / {', '.join(self.secondary_opts)}", text


def bool_flag(name: str, **attrs: Any) -> Callable[[F], F]:
    """A click decorator adding the `BoolFlag` `name` (e.g. "--tui"); `attrs` as for
    `click.option` (default, help, show_default, envvar, ...)."""
    return click.option(name, cls=BoolFlag, **attrs)
