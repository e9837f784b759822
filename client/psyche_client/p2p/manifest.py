"""The model manifest a node serves to late joiners: what the model is and how to check it.

A manifest lists, for each parameter (sorted by name), its dtype, shape, byte size and the
SHA-256 of its serialized bytes, plus the step and epoch the weights correspond to and,
optionally, the model config and tokenizer as JSON text (reference `ModelConfig`). Its
canonical msgpack encoding makes two manifests comparable by `digest()`: a joiner trusts the
manifest most of its responding peers agree on (see `model_share`). torch-free on purpose:
`psyche_client.training.model.loading` builds the values from a model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from psyche_common.protocol import BadFrame, decode_payload, encode_payload

MANIFEST_FORMAT = "psyche-py/model-manifest/v1"
MAX_CONFIG_JSON = 1024 * 1024
"""Longest `config_json` accepted (a model config is a few KiB)."""


class ManifestError(ValueError):
    """A received manifest is malformed (the message names the field)."""


@dataclass(frozen=True)
class ParameterInfo:
    """One parameter of a shared model: name, dtype, shape, byte size and SHA-256."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    size: int
    sha256: bytes

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "size": self.size,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class ModelManifest:
    """What a peer offers for download: the step and epoch, every parameter, config and tokenizer."""

    step: int
    epoch: int
    parameters: tuple[ParameterInfo, ...]
    config_json: str = ""
    tokenizer_json: str = ""

    @classmethod
    def build(
        cls,
        *,
        step: int,
        epoch: int,
        parameters: Iterable[ParameterInfo],
        config_json: str = "",
        tokenizer_json: str = "",
    ) -> ModelManifest:
        """A manifest with parameters in sorted-name order (names must be unique)."""
        ordered = tuple(sorted(parameters, key=lambda p: p.name))
        names = [p.name for p in ordered]
        if len(set(names)) != len(names):
            raise ManifestError("manifest parameter names must be unique")
        return cls(step, epoch, ordered, config_json, tokenizer_json)

    def parameter(self, name: str) -> ParameterInfo | None:
        return next((p for p in self.parameters if p.name == name), None)

    @property
    def total_bytes(self) -> int:
        return sum(p.size for p in self.parameters)

    def to_wire(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "step": self.step,
            "epoch": self.epoch,
            "config_json": self.config_json,
            "tokenizer_json": self.tokenizer_json,
            "parameters": [p.to_wire() for p in self.parameters],
        }

    def encode(self) -> bytes:
        return encode_payload(self.to_wire())

    def digest(self) -> bytes:
        return hashlib.sha256(self.encode()).digest()

    def content_digest(self) -> bytes:
        """SHA-256 over what a joiner loads (the parameters, config and tokenizer), not the
        step and epoch labels: two honest peers with the same weights agree on it even when
        one shared them at a Cooldown and the other at the next Warmup."""
        body = [
            [p.to_wire() for p in self.parameters],
            self.config_json,
            self.tokenizer_json,
        ]
        return hashlib.sha256(encode_payload(body)).digest()

    def config(self) -> dict[str, object] | None:
        """The model config as a JSON object (None when the manifest carries none); checked
        when the manifest was decoded, so this never raises for a received manifest."""
        return parse_config(self.config_json)

    def weights_digest(self) -> bytes:
        """SHA-256 over the parameters alone (names, dtypes, shapes, hashes): equal for two
        manifests of the same weights whatever step or epoch they are labelled with."""
        return hashlib.sha256(encode_payload([p.to_wire() for p in self.parameters])).digest()

    @classmethod
    def decode(cls, data: bytes) -> ModelManifest:
        try:
            wire = decode_payload(data)
        except BadFrame as exc:
            raise ManifestError(f"manifest is not msgpack: {exc}") from exc
        return cls.from_wire(wire)

    @classmethod
    def from_wire(cls, wire: Any) -> ModelManifest:
        if not isinstance(wire, dict):
            raise ManifestError("manifest must be a map")
        if wire.get("format") != MANIFEST_FORMAT:
            raise ManifestError(f"manifest.format must be {MANIFEST_FORMAT!r}")
        for name in ("step", "epoch"):
            value = wire.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ManifestError(f"manifest.{name} must be a non-negative integer")
        for name in ("config_json", "tokenizer_json"):
            if not isinstance(wire.get(name), str):
                raise ManifestError(f"manifest.{name} must be a string")
        parse_config(wire["config_json"])
        raw_parameters = wire.get("parameters")
        if not isinstance(raw_parameters, list):
            raise ManifestError("manifest.parameters must be a list")
        parameters = [_parameter_from_wire(i, p) for i, p in enumerate(raw_parameters)]
        manifest = cls.build(
            step=wire["step"],
            epoch=wire["epoch"],
            parameters=parameters,
            config_json=wire["config_json"],
            tokenizer_json=wire["tokenizer_json"],
        )
        if [p.name for p in manifest.parameters] != [p.name for p in parameters]:
            raise ManifestError("manifest.parameters must be sorted by name")
        return manifest


def parse_config(text: str) -> dict[str, object] | None:
    """`config_json` as a JSON object, None for ""; raises `ManifestError` for anything else
    (too long, not JSON, nested too deep for the parser, not an object)."""
    if not text:
        return None
    if len(text) > MAX_CONFIG_JSON:
        raise ManifestError(
            f"manifest.config_json is {len(text)} characters (at most {MAX_CONFIG_JSON})"
        )
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"manifest.config_json is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ManifestError(
            f"manifest.config_json must be a JSON object, got {type(config).__name__}"
        )
    return config


def _parameter_from_wire(index: int, wire: Any) -> ParameterInfo:
    where = f"manifest.parameters[{index}]"
    if not isinstance(wire, dict) or set(wire) != {"name", "dtype", "shape", "size", "sha256"}:
        raise ManifestError(f"{where} must be a map of name, dtype, shape, size, sha256")
    if not isinstance(wire["name"], str) or not wire["name"]:
        raise ManifestError(f"{where}.name must be a non-empty string")
    if not isinstance(wire["dtype"], str):
        raise ManifestError(f"{where}.dtype must be a string")
    shape = wire["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ManifestError(f"{where}.shape must be a list of non-negative integers")
    size = wire["size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ManifestError(f"{where}.size must be a non-negative integer")
    if not isinstance(wire["sha256"], bytes) or len(wire["sha256"]) != 32:
        raise ManifestError(f"{where}.sha256 must be 32 bytes")
    return ParameterInfo(wire["name"], wire["dtype"], tuple(shape), size, wire["sha256"])


def parameter_info(name: str, dtype: str, shape: Iterable[int], data: bytes) -> ParameterInfo:
    """The manifest entry of a parameter whose serialized bytes are `data`."""
    return ParameterInfo(name, dtype, tuple(shape), len(data), hashlib.sha256(data).digest())
