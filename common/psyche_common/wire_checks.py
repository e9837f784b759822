"""Checks on decoded msgpack values: maps, lists and unsigned integers, with errors naming the
field at fault (`round.data_index must be a non-negative integer, got -1`)."""

from __future__ import annotations

from typing import Any


def wire_uint(data: dict[str, Any], key: str, what: str) -> int:
    """`data[key]` as a non-negative integer (bools refused), else ValueError naming `what.key`."""
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what}.{key} must be a non-negative integer, got {value!r:.80}")
    return value


def wire_map(data: Any, what: str) -> dict[str, Any]:
    """`data` itself when it is a map, else ValueError naming `what`."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a map, got {type(data).__name__}")
    return data


def wire_list(data: dict[str, Any], key: str, what: str) -> list[Any]:
    """`data[key]` as a list (a tuple is accepted), else ValueError naming `what.key`."""
    value = data.get(key)
    if not isinstance(value, list | tuple):
        raise ValueError(f"{what}.{key} must be a list, got {type(value).__name__}")
    return list(value)
