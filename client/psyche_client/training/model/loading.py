"""Loading the client's model: sources, preset configs and seeded initialisation.

A checkpoint `repo_id` (the `source` of `load_model`) is classified from its text alone
(`psyche_common.model_source`):
  1. `builtin:NAME`: a packaged preset config (`psyche_client/training/model/presets/NAME.json`), seeded;
  2. a Hub repo id (`NAME` or `OWNER/NAME`): fetched with `huggingface_hub.snapshot_download`,
     even when a local directory of that name exists;
  3. anything else is a local path (`/abs`, `./rel`, `../rel`, `~/m`, `a/b/c`) that must be an
     existing directory in Hugging Face format: `config.json` plus weights (`*.safetensors`
     or `pytorch_model*.bin`) are loaded; `config.json` alone is built from the config with a
     deterministic seed.

Seeded weights do not depend on the global torch RNG or the device: every parameter is drawn on
the CPU from its own `torch.Generator`, seeded from (seed, parameter name), so every machine
builds bit-identical weights; `weights_hash` proves it. Parameters are always visited in
ascending name order (the order DisTrO and the hash use).

Hashing and raw parameter bytes live in `psyche_client.training.model.params`, checkpoint saving and
the Hub upload in `psyche_client.training.model.checkpoint`; both are re-exported here so
`psyche_client.training.model.loading` stays the one import for model I/O.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from psyche_common.model_source import BUILTIN_PREFIX, SourceKind, classify_source
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from psyche_client.training.model.checkpoint import (
    TOKENIZER_FILE_PATTERNS,
    CheckpointUploadError,
    save_checkpoint,
    upload_to_hub,
)
from psyche_client.training.model.device import resolve_device
from psyche_client.training.model.params import (
    ParameterEntry,
    count_parameters,
    load_parameter_bytes,
    model_parameters_manifest,
    parameter_bytes,
    parameter_names,
    raw_parameters,
    weights_hash,
)

__all__ = [
    "BUILTIN_PREFIX",
    "DEFAULT_SEED",
    "CheckpointUploadError",
    "ModelInfo",
    "ModelLoadError",
    "ParameterEntry",
    "build_model_from_config",
    "builtin_config",
    "config_from_dict",
    "count_parameters",
    "list_builtin_presets",
    "load_model",
    "load_model_config",
    "load_parameter_bytes",
    "model_parameters_manifest",
    "parameter_bytes",
    "parameter_names",
    "raw_parameters",
    "save_checkpoint",
    "seeded_init_",
    "upload_to_hub",
    "weights_hash",
]

DEFAULT_SEED = 1337
# Files besides the weights that belong with a model and are copied into checkpoints.
EXTRA_FILE_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer*.json",
    "tokenizer.model",
    "special_tokens_map.json",
)
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model"]


class ModelLoadError(RuntimeError):
    """A model source could not be resolved or loaded; the message names the source."""


@dataclass(frozen=True)
class ModelInfo:
    """Where a loaded model came from and what belongs with it."""

    source: str
    kind: str  # "local" | "builtin" | "hub"
    seeded: bool  # True when the weights were built from the config with `seed`
    seed: int | None
    path: Path | None  # directory holding config.json (None for builtins)
    config: dict[str, Any]
    num_parameters: int
    extra_files: tuple[Path, ...] = field(default=())
    revision: str | None = None

    @property
    def tokenizer_files(self) -> tuple[Path, ...]:
        return tuple(
            p for p in self.extra_files if any(p.match(pat) for pat in TOKENIZER_FILE_PATTERNS)
        )


# ---------------------------------------------------------------- presets and configs


def list_builtin_presets() -> list[str]:
    """Names usable as `builtin:NAME`."""
    root = resources.files("psyche_client.training.model.presets")
    return sorted(p.name.removesuffix(".json") for p in root.iterdir() if p.name.endswith(".json"))


def builtin_config(name: str) -> dict[str, Any]:
    """The config dict of a built-in preset."""
    resource = resources.files("psyche_client.training.model.presets").joinpath(f"{name}.json")
    if not resource.is_file():
        known = ", ".join(list_builtin_presets())
        raise ModelLoadError(f"unknown built-in model {BUILTIN_PREFIX}{name} (known: {known})")
    return json.loads(resource.read_text(encoding="utf-8"))


def config_from_dict(config: dict[str, Any] | PretrainedConfig) -> PretrainedConfig:
    """A transformers config from a config.json dict (needs `model_type`)."""
    if isinstance(config, PretrainedConfig):
        return config
    values = dict(config)
    model_type = values.pop("model_type", None)
    if not model_type:
        raise ModelLoadError("model config has no 'model_type' (needed to pick the architecture)")
    try:
        return AutoConfig.for_model(model_type, **values)
    except (ValueError, KeyError) as exc:
        raise ModelLoadError(f"invalid model config (model_type {model_type!r}): {exc}") from exc


def _check_supported(config: PretrainedConfig, source: str) -> None:
    """Refuse a config transformers cannot build as a causal LM (tied embeddings are fine:
    `named_parameters()` yields the shared tensor once, under the input embedding's name)."""
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelLoadError(
            f"model {source}: model_type {config.model_type!r} is not a causal language model "
            "that transformers builds (AutoModelForCausalLM)"
        )


# ---------------------------------------------------------------- seeded construction


def _parameter_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}\x00{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@torch.no_grad()
def seeded_init_(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Overwrite every parameter deterministically: matrices ~ N(0, std) drawn on the CPU from a
    per-parameter generator, 1-D weights (norms) = 1, biases = 0, embedding padding rows = 0."""
    padding_rows: dict[str, int] = {}
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and module.padding_idx is not None:
            padding_rows[f"{module_name}.weight" if module_name else "weight"] = module.padding_idx
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        if name.endswith("bias"):
            values = torch.zeros(param.shape, dtype=torch.float32)
        elif param.dim() <= 1:
            values = torch.ones(param.shape, dtype=torch.float32)
        else:
            generator = torch.Generator(device="cpu").manual_seed(_parameter_seed(seed, name))
            values = torch.empty(param.shape, dtype=torch.float32)
            values.normal_(mean=0.0, std=std, generator=generator)
            if name in padding_rows:
                values[padding_rows[name]].zero_()
        param.copy_(values.to(device=param.device, dtype=param.dtype))


def build_model_from_config(
    config: dict[str, Any] | PretrainedConfig,
    seed: int = DEFAULT_SEED,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> PreTrainedModel:
    """A causal LM built from a config with deterministic, seeded weights."""
    hf_config = config_from_dict(config)
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    std = float(getattr(hf_config, "initializer_range", 0.02) or 0.02)
    seeded_init_(model, seed, std)
    return model.to(device=_as_device(device), dtype=dtype)


# ---------------------------------------------------------------- loading


def _as_device(device: torch.device | str) -> torch.device:
    return device if isinstance(device, torch.device) else resolve_device(device)


def _has_weights(directory: Path) -> bool:
    return any(directory.glob("*.safetensors")) or any(directory.glob("pytorch_model*.bin"))


def _extra_files(directory: Path) -> tuple[Path, ...]:
    found: set[Path] = set()
    for pattern in EXTRA_FILE_PATTERNS:
        found.update(p for p in directory.glob(pattern) if p.is_file())
    return tuple(sorted(found))


@contextlib.contextmanager
def _hub_download(what: str, revision: str | None) -> Iterator[None]:
    """Any failure inside (network, auth, missing repo, invalid id: all end the same way)
    becomes a `ModelLoadError` saying `what` could not be downloaded."""
    try:
        yield
    except Exception as exc:
        at = f"@{revision}" if revision else ""
        raise ModelLoadError(
            f"could not download {what}{at} from the Hugging Face Hub: {exc}; "
            "pass a local directory"
        ) from exc


def _local_directory(source: str) -> Path:
    """The directory a source written as a local path names; `ModelLoadError` otherwise."""
    local = Path(source).expanduser()
    if not local.is_dir():
        raise ModelLoadError(
            f"model source {source!r} is written as a local path but is not a directory "
            "(a Hub repo id is NAME or OWNER/NAME, a preset builtin:NAME)"
        )
    return local


def _snapshot(source: str, revision: str | None, max_workers: int = 8) -> Path:
    """The repo's files in the Hugging Face cache (`max_workers`: files fetched at once;
    8 is huggingface_hub's own default)."""
    from huggingface_hub import snapshot_download

    with _hub_download(source, revision):
        path = snapshot_download(
            repo_id=source,
            revision=revision,
            allow_patterns=HUB_ALLOW_PATTERNS,
            max_workers=max_workers,
        )
    return Path(path)


def download_hub_model(source: str, revision: str | None, max_workers: int) -> Path:
    """Fetch the files `load_model` reads of the Hub repo `source` into the Hugging Face
    cache, at most `max_workers` files at once (`--hub-max-concurrent-downloads`); the load
    that follows finds them there. Raises `ModelLoadError` naming the repo."""
    return _snapshot(source, revision, max_workers)


def _read_config(config_path: Path) -> dict[str, Any]:
    try:
        return json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {config_path}: {exc}") from exc


def load_model_config(source: str, revision: str | None = None) -> dict[str, Any]:
    """The config.json dict of a model source, resolved like `load_model` (local directory,
    `builtin:NAME`, Hub repo) but without building the model or fetching its weights."""
    kind = classify_source(source)
    if kind == SourceKind.LOCAL:
        return _read_config(_local_directory(source) / "config.json")
    if kind == SourceKind.BUILTIN:
        return builtin_config(source.removeprefix(BUILTIN_PREFIX))
    from huggingface_hub import hf_hub_download

    with _hub_download(f"config.json of {source}", revision):
        path = hf_hub_download(source, "config.json", revision=revision)
    return _read_config(Path(path))


def _load_directory(
    directory: Path,
    source: str,
    kind: str,
    revision: str | None,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
) -> tuple[PreTrainedModel, ModelInfo]:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"model directory {directory} has no config.json")
    config_dict = _read_config(config_path)
    hf_config = config_from_dict(config_dict)
    _check_supported(hf_config, source)
    seeded = not _has_weights(directory)
    if seeded:
        model = build_model_from_config(hf_config, seed=seed, dtype=dtype, device=device)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"cannot load the weights in {directory}: {exc}") from exc
        model = model.to(_as_device(device))  # type: ignore[arg-type]  # transformers' stub wraps .to
    info = ModelInfo(
        source=source,
        kind=kind,
        seeded=seeded,
        seed=seed if seeded else None,
        path=directory,
        config=config_dict,
        num_parameters=count_parameters(model),
        extra_files=_extra_files(directory),
        revision=revision,
    )
    return model, info


def load_model(
    source: str,
    revision: str | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    seed: int = DEFAULT_SEED,
) -> tuple[PreTrainedModel, ModelInfo]:
    """Load a causal LM from a local directory, a `builtin:NAME` preset or a Hub repo id
    (which one is decided from the text of `source`, see `psyche_common.model_source`).

    Seeded models (presets, config-only directories) are built with `seed`. The model is
    returned in train mode on `device` with parameters of `dtype`.
    """
    kind = classify_source(source)
    if kind == SourceKind.LOCAL:
        local = _local_directory(source)
        model, info = _load_directory(local, source, "local", revision, seed, device, dtype)
    elif kind == SourceKind.BUILTIN:
        name = source.removeprefix(BUILTIN_PREFIX)
        config_dict = builtin_config(name)
        hf_config = config_from_dict(config_dict)
        _check_supported(hf_config, source)
        model = build_model_from_config(hf_config, seed=seed, dtype=dtype, device=device)
        info = ModelInfo(
            source=source,
            kind="builtin",
            seeded=True,
            seed=seed,
            path=None,
            config=config_dict,
            num_parameters=count_parameters(model),
        )
    else:
        directory = _snapshot(source, revision)
        model, info = _load_directory(directory, source, "hub", revision, seed, device, dtype)
    model.train()
    return model, info
