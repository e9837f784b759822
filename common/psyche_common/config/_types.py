"""Primitive field types shared by the configuration models.

The reference stores configuration in fixed-width Rust integers and fixed-capacity strings. These
annotated types reproduce those bounds so that a value that could not be represented by the
reference is rejected when the file is loaded, with a message naming the field.
"""

from __future__ import annotations

import decimal
import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, Strict
from pydantic_core import PydanticCustomError

U8_MAX = 2**8 - 1
U16_MAX = 2**16 - 1
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1

U8 = Annotated[int, Strict(), Field(ge=0, le=U8_MAX)]
U16 = Annotated[int, Strict(), Field(ge=0, le=U16_MAX)]
U32 = Annotated[int, Strict(), Field(ge=0, le=U32_MAX)]
U64 = Annotated[int, Strict(), Field(ge=0, le=U64_MAX)]
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Bool = Annotated[bool, Strict()]


def seconds_to_ms(seconds: int | float) -> int:
    """A duration in seconds (whole or fractional) as whole milliseconds."""
    if isinstance(seconds, int):
        return seconds * 1000
    return round(seconds * 1000)


def _ms_seconds(value: object) -> int | float:
    """A duration in seconds: a u64 (as in the reference) or a finite, non-negative decimal
    of whole milliseconds (at most 3 decimals)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError(
            "seconds_type",
            "must be a number of seconds (an integer, or a decimal such as 0.25), not {value}",
            {"value": repr(value)},
        )
    if isinstance(value, int):
        if not 0 <= value <= U64_MAX:
            raise PydanticCustomError(
                "seconds_range", "must be between 0 and {max} seconds", {"max": U64_MAX}
            )
        return value
    if not math.isfinite(value) or value < 0 or value > U64_MAX / 1000:
        raise PydanticCustomError(
            "seconds_range",
            "{value} is not a finite, non-negative number of seconds",
            {"value": value},
        )
    # the number as written (its shortest decimal form): value * 1000 is not exact in binary
    # floating point for large values (16817707.109 * 1000 is 16817707109.000002)
    exponent = decimal.Decimal(repr(value)).as_tuple().exponent
    if not isinstance(exponent, int) or exponent < -3:
        raise PydanticCustomError(
            "seconds_precision",
            "{value} s is not a whole number of milliseconds (at most 3 decimals)",
            {"value": value},
        )
    return value


MsSeconds = Annotated[int | float, PlainValidator(_ms_seconds)]
"""Seconds: a u64 as in the reference, or a fractional number of whole milliseconds (ours)."""

RUN_ID_MAX_BYTES = 32
SHORT_STRING_MAX_BYTES = 64
URL_STRING_MAX_BYTES = 192


def _byte_limit(max_bytes: int) -> AfterValidator:
    def check(value: str) -> str:
        length = len(value.encode("utf-8"))
        if length > max_bytes:
            raise PydanticCustomError(
                "string_too_many_bytes",
                "is {length} bytes long in UTF-8; at most {max_bytes} bytes are allowed "
                "(the reference would silently truncate it)",
                {"length": length, "max_bytes": max_bytes},
            )
        return value

    return AfterValidator(check)


RunIdStr = Annotated[str, Strict(), _byte_limit(RUN_ID_MAX_BYTES)]
ShortStr = Annotated[str, Strict(), _byte_limit(SHORT_STRING_MAX_BYTES)]
UrlStr = Annotated[str, Strict(), _byte_limit(URL_STRING_MAX_BYTES)]


class StrictModel(BaseModel):
    """Base of every configuration table: unknown keys are errors, values are not coerced."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def drop_none(table: dict[str, Any]) -> dict[str, Any]:
    """TOML has no null: optional fields that are unset are left out of the written table."""
    return {key: value for key, value in table.items() if value is not None}
