"""Checkpoints of a trained model: a Hugging Face safetensors directory (with the tokenizer and
the model's other files), written from a model or from a state dict, and its upload to the Hub
as one commit."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import PretrainedConfig, PreTrainedModel

from psyche_client.training.model.checkpoint_dir import CheckpointError

# Tokenizer files copied from a tokenizer directory into a checkpoint.
TOKENIZER_FILE_PATTERNS = ("tokenizer*.json", "tokenizer.model", "special_tokens_map.json")


class CheckpointUploadError(CheckpointError):
    """A checkpoint upload to the Hub failed; the message names the directory and repo."""


def _copy_tokenizer(tokenizer_path: Path, directory: Path) -> None:
    if tokenizer_path.is_dir():
        for pattern in TOKENIZER_FILE_PATTERNS:
            for file in tokenizer_path.glob(pattern):
                if file.is_file():
                    shutil.copy2(file, directory / file.name)
    elif tokenizer_path.is_file():
        shutil.copy2(tokenizer_path, directory / tokenizer_path.name)
    else:
        raise FileNotFoundError(f"tokenizer {tokenizer_path} does not exist")


def save_checkpoint(
    model: PreTrainedModel,
    directory: str | Path,
    tokenizer_path: str | Path | None = None,
    extra_files: Iterable[str | Path] = (),
) -> Path:
    """Write `model` as a Hugging Face safetensors directory (config.json + weights) that
    `AutoModelForCausalLM.from_pretrained` loads back; copy the tokenizer (a file, or the
    tokenizer files of a directory) and any extra files that are not written already."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target))
    if tokenizer_path is not None:
        _copy_tokenizer(Path(tokenizer_path), target)
    for extra in extra_files:
        extra_path = Path(extra)
        if not (target / extra_path.name).exists():
            shutil.copy2(extra_path, target / extra_path.name)
    return target


def save_state_checkpoint(
    state: dict[str, torch.Tensor],
    config: PretrainedConfig,
    directory: str | Path,
    extra_files: Iterable[str | Path] = (),
) -> Path:
    """Write a checkpoint from a state dict (a model no process holds whole, e.g. a sharded
    one): `model.safetensors` and `config.json` in the layout `save_checkpoint` writes, plus
    any extra files that are not written already."""
    from safetensors.torch import save_file

    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: tensor.contiguous() for name, tensor in state.items()},
        str(target / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config.save_pretrained(str(target))
    for extra in extra_files:
        extra_path = Path(extra)
        if not (target / extra_path.name).exists():
            shutil.copy2(extra_path, target / extra_path.name)
    return target


def upload_to_hub(
    directory: str | Path, repo_id: str, token: str | None, commit_message: str | None = None
) -> str:
    """Upload a checkpoint directory as one commit; returns the commit id (the revision)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    message = commit_message or f"upload {Path(directory).name}"
    try:
        commit = api.upload_folder(
            folder_path=str(directory), repo_id=repo_id, commit_message=message
        )
    except Exception as exc:
        raise CheckpointUploadError(
            f"could not upload {directory} to the Hub repo {repo_id}: {exc}"
        ) from exc
    return str(commit.oid)
