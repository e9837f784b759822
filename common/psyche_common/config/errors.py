"""`ConfigError` and the translation of pydantic errors into messages naming the TOML field."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration.

    `field` is the dotted TOML path (`config.warmup_time`, `model.LLM.checkpoint.Hub.repo_id`),
    `message` a complete sentence for the user, `rule` the reference's error name when there is one.
    """

    field: str
    message: str
    rule: str | None = None

    def __str__(self) -> str:
        return f"{self.message} [{self.rule}]" if self.rule else self.message


class ConfigError(Exception):
    """A configuration file that cannot be used; `problems` lists every reason found."""

    def __init__(self, problems: Sequence[ConfigProblem], source: Path | str | None = None) -> None:
        self.problems = list(problems)
        self.source = Path(source) if source is not None else None
        super().__init__(self._text())

    def _text(self) -> str:
        where = f" in {self.source}" if self.source is not None else ""
        lines = [f"{len(self.problems)} configuration error(s){where}:"]
        lines.extend(f"  - {problem}" for problem in self.problems)
        return "\n".join(lines)


# Variants whose TOML value is a scalar (`{ Server = "host:port" }`) keep it in one named field;
# that field name is not part of the TOML path, so it is dropped from error locations.
_SCALAR_FIELDS = {
    ("Server", "address"),
    ("Local", "path"),
    ("WeightedHttp", "url"),
    ("Preprocessed", "url"),
    ("Builtin", "name"),
    ("SingleUrl", "url"),
    ("Seeded", "seed"),
}

_TYPE_WORDS = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a table",
    "tuple_type": "must be an array",
    "model_type": "must be a table",
}


def toml_path(loc: Sequence[str | int], prefix: Sequence[str] = ()) -> str:
    """Dotted TOML path of a pydantic error location (`model.LLM.optimizer.Distro.quantize_1bit`)."""
    parts: list[str | int] = [*prefix, *loc]
    if len(parts) > 1 and parts[0] == "model" and parts[1] != "LLM":
        parts.insert(1, "LLM")
    text = ""
    previous: str | int | None = None
    for part in parts:
        if (previous, part) in _SCALAR_FIELDS:
            previous = part
            continue
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
        previous = part
    return text or "(top level)"


def _describe(error: Any) -> str:
    kind = error["type"]
    value = error.get("input")
    if kind == "missing":
        return "is required but missing"
    if kind == "extra_forbidden":
        return "unknown key (not a field of this table; check the spelling)"
    if kind in _TYPE_WORDS:
        return f"{_TYPE_WORDS[kind]} (got {value!r})"
    if kind in ("too_short", "too_long"):
        context = error.get("ctx", {})
        count = context.get("actual_length", len(value) if hasattr(value, "__len__") else "?")
        bound = context.get("min_length") if kind == "too_short" else context.get("max_length")
        return f"must have {'at least' if kind == 'too_short' else 'at most'} {bound} items (got {count})"
    message = str(error["msg"])
    message = message.removeprefix("Value error, ")
    if message.startswith("Input should be"):
        message = "must be" + message.removeprefix("Input should be")
        if not isinstance(value, dict | list):
            message += f" (got {value!r})"
    return message


def problems_from_validation_error(
    error: ValidationError, prefix: Sequence[str] = ()
) -> list[ConfigProblem]:
    """One `ConfigProblem` per pydantic error, each naming the TOML field."""
    items = error.errors(include_url=False)
    item_locs = [tuple(item["loc"]) for item in items]
    problems = []
    for item in items:
        loc = tuple(item["loc"])
        if item["type"] in ("too_short", "too_long") and any(
            other[: len(loc)] == loc and len(other) > len(loc) for other in item_locs
        ):
            continue  # pydantic counts only the valid items; the bad item is reported already
        path = toml_path(item["loc"], prefix)
        problems.append(ConfigProblem(field=path, message=f"{path}: {_describe(item)}"))
    return problems
