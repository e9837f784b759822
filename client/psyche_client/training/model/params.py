"""A model's parameters as raw data: the weights hash, the per-parameter manifest, and the raw
bytes of one parameter (read and overwrite), as the P2P model share and the cooldown use them.

Parameters are always visited in ascending name order (the order DisTrO and the hash use);
raw bytes are the contiguous CPU layout (native little-endian).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import NamedTuple

import torch


class ParameterEntry(NamedTuple):
    """One row of a model's parameter manifest."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    sha256: str


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _sorted_parameters(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return sorted(model.named_parameters(), key=lambda item: item[0])


def _raw_view(tensor: torch.Tensor) -> memoryview:
    cpu = tensor.detach().to("cpu").contiguous()
    flat: bytes | memoryview = cpu.reshape(-1).view(torch.uint8).numpy().data
    return memoryview(flat)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def weights_hash(model: torch.nn.Module) -> bytes:
    """SHA-256 (32 bytes) over every parameter in ascending name order: for each one the name, the
    dtype, the shape and the raw little-endian bytes, each length-prefixed."""
    return hash_parameters(_sorted_parameters(model))


def hash_parameters(named: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """`weights_hash` over `(name, tensor)` pairs given in ascending name order, consumed one
    at a time (a sharded model streams its parameters through it)."""
    digest = hashlib.sha256()
    for name, param in named:
        for part in (name.encode(), _dtype_name(param.dtype).encode()):
            digest.update(len(part).to_bytes(4, "little"))
            digest.update(part)
        digest.update(len(param.shape).to_bytes(4, "little"))
        for dim in param.shape:
            digest.update(int(dim).to_bytes(8, "little"))
        raw = _raw_view(param)
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.digest()


def model_parameters_manifest(model: torch.nn.Module) -> list[ParameterEntry]:
    """(name, dtype, shape, sha256 of the raw bytes) of every parameter, in name order."""
    return [
        ParameterEntry(
            name=name,
            dtype=_dtype_name(param.dtype),
            shape=tuple(int(d) for d in param.shape),
            sha256=hashlib.sha256(_raw_view(param)).hexdigest(),
        )
        for name, param in _sorted_parameters(model)
    ]


def raw_parameters(model: torch.nn.Module) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    """(name, dtype, shape, raw bytes) of every parameter, in name order; unlike
    `model_parameters_manifest` it hashes nothing."""
    return [raw_entry(name, param) for name, param in _sorted_parameters(model)]


def raw_entry(name: str, tensor: torch.Tensor) -> tuple[str, str, tuple[int, ...], bytes]:
    """(name, dtype, shape, raw bytes) of one tensor, as `raw_parameters` lists them."""
    return (name, _dtype_name(tensor.dtype), tuple(int(d) for d in tensor.shape), raw_bytes(tensor))


def raw_bytes(tensor: torch.Tensor) -> bytes:
    """The raw contiguous CPU bytes of a tensor (native little-endian layout)."""
    return bytes(_raw_view(tensor))


def parameter_names(model: torch.nn.Module) -> set[str]:
    """The names of every parameter of `model`."""
    return {name for name, _ in model.named_parameters()}


def _parameter(model: torch.nn.Module, name: str) -> torch.Tensor:
    try:
        return model.get_parameter(name)
    except AttributeError as exc:
        raise KeyError(f"model has no parameter named {name!r}") from exc


def parameter_bytes(model: torch.nn.Module, name: str) -> bytes:
    """The raw contiguous CPU bytes of one parameter (native little-endian layout)."""
    return bytes(_raw_view(_parameter(model, name)))


@torch.no_grad()
def load_parameter_bytes(model: torch.nn.Module, name: str, data: bytes) -> None:
    """Overwrite one parameter from `parameter_bytes` output of an identically shaped model."""
    param = _parameter(model, name)
    expected = param.numel() * param.element_size()
    if len(data) != expected:
        raise ValueError(
            f"parameter {name}: got {len(data)} bytes, expected {expected} "
            f"({_dtype_name(param.dtype)} {tuple(param.shape)})"
        )
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    values = raw.view(param.dtype).reshape(param.shape)
    param.copy_(values.to(param.device))
