"""Primitive field types shared by the configuration models.

The reference stores configuration in fixed-width Rust integers and fixed-capacity strings. These
annotated types reproduce those bounds so that a value that could not be represented by the
reference is rejected when the file is loaded, with a message naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict
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
