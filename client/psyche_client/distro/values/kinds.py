"""The registry of value formats: `ValueKind`, one member per format, naming its codec.

A member's value is the result header's value-kind byte, so `ValueKind(byte)` reads a header
and `int(kind)` writes one; `kind.codec` is the format's `ValueCodec`. Adding a value format
is its codec module and one line here (see docs/architecture.md, "Adding a value format").
"""

from __future__ import annotations

from enum import IntEnum

from psyche_client.distro.values.bf16 import Bf16Values
from psyche_client.distro.values.codebook import CodebookValues
from psyche_client.distro.values.codec import ValueCodec
from psyche_client.distro.values.four_bit import FourBitValues
from psyche_client.distro.values.one_bit import OneBitValues
from psyche_client.distro.values.two_bit import TwoBitValues


class ValueKind(IntEnum):
    codec: ValueCodec

    def __new__(cls, byte: int, codec: ValueCodec | None = None) -> ValueKind:
        # `codec` is always given here; the default only lets type checkers accept the
        # lookup `ValueKind(byte)`, which never reaches `__new__`.
        if codec is None:
            raise TypeError(f"value kind {byte} needs its codec")
        member = int.__new__(cls, byte)
        member._value_ = byte
        member.codec = codec
        return member

    BF16 = 0, Bf16Values()
    ONE_BIT = 1, OneBitValues()
    TWO_BIT = 2, TwoBitValues()
    TWO_BIT_CODEBOOK = 3, CodebookValues()
    FOUR_BIT = 4, FourBitValues()


def value_kind_named(name: str) -> ValueKind:
    """The kind whose codec is called `name` (`value_format` in `state.toml`)."""
    for kind in ValueKind:
        if kind.codec.name == name:
            return kind
    known = ", ".join(repr(kind.codec.name) for kind in ValueKind)
    raise ValueError(f"unknown value format {name!r}; known: {known}")
