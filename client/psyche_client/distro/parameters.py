"""What both DisTrO-style optimizers set up on a model's parameters: the parameters in
canonical (sorted-name) order, the `Compressor` for them, and float32 state buffers.

API: `STATE_DTYPE`, `CompressionSettings`, `compressed_parameters(named_parameters, settings,
**compressor_options) -> (params, compressor)`, `zero_buffers(params)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch

from psyche_client.distro.compressor import Compressor
from psyche_client.distro.values import ValueKind

STATE_DTYPE = torch.float32
"""The dtype of DisTrO's momentum and SparseLoCo's error feedback, whatever the parameters'."""

NamedParameter = tuple[str, torch.nn.Parameter]


class CompressionSettings(Protocol):
    @property
    def compression_chunk(self) -> int: ...

    @property
    def compression_topk(self) -> int: ...

    @property
    def value_kind(self) -> ValueKind: ...


def compressed_parameters(
    named_parameters: Iterable[NamedParameter],
    settings: CompressionSettings,
    **compressor_options: Any,
) -> tuple[list[NamedParameter], Compressor]:
    """The parameters sorted by name (names must be unique) and the `Compressor` of their
    shapes with the settings' chunk, top-k and value kind (`compressor_options`: the rest)."""
    params = sorted(named_parameters, key=lambda item: item[0])
    names = [name for name, _ in params]
    if len(set(names)) != len(names):
        raise ValueError("parameter names must be unique")
    compressor = Compressor(
        ((name, tuple(p.shape)) for name, p in params),
        settings.compression_chunk,
        settings.compression_topk,
        settings.value_kind,
        **compressor_options,
    )
    return params, compressor


def zero_buffers(params: Iterable[NamedParameter]) -> list[torch.Tensor]:
    """One zeroed `STATE_DTYPE` buffer per parameter, of its shape and on its device."""
    return [
        torch.zeros_like(p, dtype=STATE_DTYPE, memory_format=torch.contiguous_format)
        for _, p in params
    ]
