"""Every field an operator writes in state.toml or data.toml is documented where it is defined:
a docstring under the field (read from the class's source, so loading the models costs
nothing for it)."""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import textwrap
import typing
from collections.abc import Iterator

from psyche_common.config import (
    CoordinatorConfig,
    DataServerConfig,
    DistroOptimizer,
    SparseLocoOptimizer,
    StateFile,
)
from pydantic import BaseModel

WRITTEN_BY_THE_SERVER = {(StateFile, "epoch_state"), (StateFile, "verification")}
"""Tables the server writes in saved states and reads back (not meant to be written by hand;
docs/configuration.md describes them)."""
VALUE_FORMAT_PENDING = {DistroOptimizer, SparseLocoOptimizer}
"""The DisTrO and SparseLoCo tables, whose value-format fields are being reworked (issue 28
item 2): their fields are documented in docs/configuration.md until then."""


def _models(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models(argument)


def written_models() -> list[type[BaseModel]]:
    """The models reachable from `StateFile` and `DataServerConfig`, the tables left out."""
    found: list[type[BaseModel]] = []
    pending: list[type[BaseModel]] = [StateFile, DataServerConfig]
    while pending:
        model = pending.pop()
        if model in found:
            continue
        found.append(model)
        for name, field in model.model_fields.items():
            if (model, name) not in WRITTEN_BY_THE_SERVER:
                pending.extend(_models(field.annotation))
    return found


@functools.cache
def documented_fields(cls: type) -> frozenset[str]:
    """The fields with a docstring (a string right under them) in the source of `cls`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    return frozenset(
        statement.target.id
        for statement, following in itertools.pairwise(body)
        if isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and isinstance(following, ast.Expr)
        and isinstance(following.value, ast.Constant)
        and isinstance(following.value.value, str)
    )


def has_docstring(model: type[BaseModel], name: str) -> bool:
    """Whether the class of `model`'s hierarchy that declares field `name` documents it."""
    owner = next(cls for cls in model.__mro__ if name in inspect.get_annotations(cls))
    return name in documented_fields(owner)


def test_every_field_has_a_docstring() -> None:
    models = written_models()
    assert CoordinatorConfig in models and len(models) > 25  # the walk reached the variants
    undocumented = [
        f"{model.__name__}.{name}"
        for model in models
        if model not in VALUE_FORMAT_PENDING
        for name in model.model_fields
        if name != "kind"
        and (model, name) not in WRITTEN_BY_THE_SERVER
        and not has_docstring(model, name)
    ]
    assert undocumented == []
