"""The value format of a DisTrO or SparseLoCo table: `value_format`, or the older booleans.

One field, `value_format`, names how a result's kept values travel: `"bf16"`, `"1-bit"`,
`"2-bit"`, `"2-bit codebook"` or `"4-bit"` (the client's value codecs by name; docs/distro.md
has their byte layouts). Tables written before it spell the same choice with booleans
(Distro: the reference's `quantize_1bit` and our `quantize_2bit`; SparseLoCo:
`quantize_2bit`, `quantize_codebook`, `quantize_4bit`). Both spellings are read:

- without `value_format`, the booleans decide, as they always did; booleans that cannot go
  together (`Clash`) are an error naming the field at fault;
- with `value_format`, every boolean that is also given must say the same (`quantize_2bit =
  true` beside `value_format = "4-bit"` is an error naming both fields).

`resolve_value_format` is the rule; each optimizer model gives it its spellings (which
booleans spell which format) and its clashes. Pure: the errors are `ValueFormatConflict`
(a `ValueError` with the dotted field at fault), turned into config problems by
`optimizer_rules`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

ValueFormat = Literal["bf16", "1-bit", "2-bit", "2-bit codebook", "4-bit"]
VALUE_FORMATS: tuple[ValueFormat, ...] = get_args(ValueFormat)
"""Every value format's name, in header-byte order (the client's `ValueKind`)."""

Spellings = Mapping[ValueFormat, Mapping[str, bool]]
"""Per value format a table can send, the older booleans that spell it (every one named)."""


class ValueFormatConflict(ValueError):
    """`value_format` and the older booleans (or two of those) disagree; `field` is at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Clash:
    """Older booleans that cannot go together: `field` true with `other` `other_is`."""

    field: str
    other: str
    other_is: bool
    why: str

    def holds(self, given: Mapping[str, bool | None]) -> bool:
        return bool(given.get(self.field)) and bool(given.get(self.other)) == self.other_is

    def describe(self, where: str) -> str:
        if self.other_is:
            return f"{where}.{self.field} and {self.other} cannot both be true ({self.why})"
        return f"{where}.{self.field} needs {self.other} = true ({self.why})"


def _toml(value: bool) -> str:
    return "true" if value else "false"


def resolve_value_format(
    where: str,
    chosen: ValueFormat | None,
    given: Mapping[str, bool | None],
    spellings: Spellings,
    clashes: Sequence[Clash] = (),
) -> ValueFormat:
    """The value format a table names (`where` is its dotted path, for the errors): `chosen`
    (its `value_format`) checked against the older booleans `given` (None: left out), or,
    without one, the format those booleans spell (left out counts as false)."""
    if chosen is not None:
        if chosen not in spellings:
            names = ", ".join(f'"{name}"' for name in spellings)
            raise ValueFormatConflict(
                f"{where}.value_format",
                f'{where}.value_format = "{chosen}" is not one this optimizer sends ({names})',
            )
        for field, value in given.items():
            if value is not None and value != spellings[chosen][field]:
                raise ValueFormatConflict(
                    f"{where}.value_format",
                    f'{where}.value_format = "{chosen}" contradicts {where}.{field} = '
                    f"{_toml(value)} (the older spelling of the same choice): leave "
                    f"{field} out, or set it to {_toml(not value)}",
                )
        return chosen
    for clash in clashes:
        if clash.holds(given):
            raise ValueFormatConflict(f"{where}.{clash.field}", clash.describe(where))
    for name, spelled in spellings.items():
        if all(bool(given.get(field)) == value for field, value in spelled.items()):
            return name
    raise ValueFormatConflict(
        f"{where}.value_format",
        f"{where}: the quantize_* booleans name no value format; set value_format instead",
    )
