"""Externally tagged enums, the way serde writes Rust enums to TOML.

A unit variant is a bare string (`"Dummy"`), a newtype variant over a scalar is a one-key table
(`{ Server = "host:port" }`) and a struct variant is a one-key table holding the fields
(`[model.LLM.checkpoint.Hub]` + `repo_id = ...`). In Python each variant is its own pydantic class
with a literal `kind` field; `toml_tagged` gives the pydantic metadata that reads the TOML form
into the union of the variants (`Annotated[A | B, *toml_tagged("what", A, B)]`) and
`Variant.to_toml()` writes it back.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar

from pydantic import BaseModel, BeforeValidator, Field, PlainSerializer
from pydantic_core import PydanticCustomError

from psyche_common.config._types import StrictModel, drop_none


class Variant(StrictModel):
    """One variant of an externally tagged enum. Subclasses declare `kind: Literal["Tag"] = "Tag"`.

    `SCALAR_FIELD` names the single field of a newtype variant over a scalar (`{ Server = "..." }`).
    """

    SCALAR_FIELD: ClassVar[str | None] = None

    @classmethod
    def tag(cls) -> str:
        tag = cls.model_fields["kind"].default
        if not isinstance(tag, str):
            raise TypeError(f"{cls.__name__}.kind needs its tag as a string default")
        return tag

    @classmethod
    def is_unit(cls) -> bool:
        return set(cls.model_fields) == {"kind"}

    def payload(self) -> dict[str, Any]:
        """The variant's fields as a TOML table (unset optional fields left out)."""
        table: dict[str, Any] = {}
        for name in type(self).model_fields:
            if name == "kind":
                continue
            table[name] = _to_toml_value(getattr(self, name))
        return drop_none(table)

    def to_toml(self) -> Any:
        """The TOML value of this variant: a string, or a one-key table."""
        cls = type(self)
        if cls.is_unit():
            return cls.tag()
        if cls.SCALAR_FIELD is not None:
            return {cls.tag(): _to_toml_value(getattr(self, cls.SCALAR_FIELD))}
        return {cls.tag(): self.payload()}


def _to_toml_value(value: Any) -> Any:
    if isinstance(value, Variant):
        return value.to_toml()
    if isinstance(value, BaseModel):
        to_toml = getattr(value, "to_toml", None)
        return to_toml() if to_toml else drop_none(value.model_dump(mode="json"))
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_to_toml_value(item) for item in value]
    return value


def _untagger(what: str, variants: tuple[type[Variant], ...]) -> Callable[[Any], Any]:
    """The before-validator that turns the TOML form of a `what` into one of `variants`."""
    by_tag = {variant.tag(): variant for variant in variants}
    expected = ", ".join(by_tag)

    def fail(kind: str, message: str) -> PydanticCustomError:
        # Pre-formatted: pydantic's own templating would treat braces in the text as fields.
        return PydanticCustomError(kind, message.replace("{", "(").replace("}", ")"))

    def unknown(tag: object) -> PydanticCustomError:
        return fail("unknown_variant", f"unknown {what} {tag!r}; expected one of: {expected}")

    def untag(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return value
        if isinstance(value, str):
            variant = by_tag.get(value)
            if variant is None:
                raise unknown(value)
            if not variant.is_unit():
                raise fail(
                    "variant_needs_fields",
                    f"{what} {value!r} needs its fields, written as a table "
                    f"(a `[...{value}]` section or `{value} = <value>` in an inline table)",
                )
            return {"kind": value}
        if isinstance(value, dict):
            if len(value) != 1:
                found = ", ".join(sorted(value)) or "no keys"
                raise fail(
                    "variant_table_shape",
                    f"the {what} table must have exactly one key naming the variant "
                    f"(one of: {expected}); found: {found}",
                )
            ((tag, payload),) = value.items()
            variant = by_tag.get(tag)
            if variant is None:
                raise unknown(tag)
            if variant.SCALAR_FIELD is not None:
                return {"kind": tag, variant.SCALAR_FIELD: payload}
            if variant.is_unit():
                if payload in ({}, [], None):
                    return {"kind": tag}
                raise fail(
                    "unit_variant_with_fields",
                    f"{what} {tag!r} takes no fields; write it as the string {tag!r}",
                )
            if not isinstance(payload, dict):
                raise fail("variant_payload_not_table", f"{what} {tag!r} must be a table of fields")
            if "kind" in payload:
                raise fail("unknown_key", f"unknown key 'kind' in {what} {tag!r}")
            return {"kind": tag, **payload}
        raise fail(
            "variant_type",
            f"the {what} must be a string or a one-key table naming one of: {expected}",
        )

    return untag


def toml_tagged(what: str, *variants: type[Variant]) -> tuple[Any, ...]:
    """The metadata of a field annotated with the union of `variants` (in the same order): the
    field is read from and dumped to its TOML form, `Annotated[A | B, *toml_tagged(what, A, B)]`."""
    return (
        Field(discriminator="kind"),
        BeforeValidator(_untagger(what, variants)),
        PlainSerializer(_variant_to_toml),
    )


def _variant_to_toml(value: Variant) -> Any:
    return value.to_toml()
