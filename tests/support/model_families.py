"""Tiny configs of the model families a run trains, built with transformers' config classes.

Every family has 2 layers, hidden size 32, 4 attention heads and a 256-token vocabulary (the
byte tokens the tests use), so a model has 25-40 thousand parameters and a forward/backward
takes milliseconds. `write_family` writes one as a local model directory (config.json only:
the client seeds its weights); `short_directory` gives a directory whose path fits a
checkpoint's `repo_id` (at most 64 bytes, which pytest's `tmp_path` often exceeds).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import transformers
from transformers import PretrainedConfig

_COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@dataclass(frozen=True)
class Family:
    """A tiny model of one family and the `model.LLM.architecture` that trains it."""

    name: str
    architecture: str
    build: Callable[[], PretrainedConfig]
    tied: bool


def _llama(tied: bool) -> PretrainedConfig:
    return transformers.LlamaConfig(**_COMMON, num_key_value_heads=2, tie_word_embeddings=tied)


def _qwen2(tied: bool) -> PretrainedConfig:
    return transformers.Qwen2Config(**_COMMON, num_key_value_heads=2, tie_word_embeddings=tied)


def _gemma2() -> PretrainedConfig:  # Gemma2 always ties its embeddings
    return transformers.Gemma2Config(**_COMMON, num_key_value_heads=2, head_dim=8, pad_token_id=0)


def _mistral() -> PretrainedConfig:
    return transformers.MistralConfig(**_COMMON, num_key_value_heads=2, tie_word_embeddings=False)


def _gpt_neox() -> PretrainedConfig:
    return transformers.GPTNeoXConfig(**_COMMON, tie_word_embeddings=False)


def _phi3() -> PretrainedConfig:
    return transformers.Phi3Config(
        **_COMMON, num_key_value_heads=2, pad_token_id=0, tie_word_embeddings=False
    )


def _deepseek_v3() -> PretrainedConfig:
    """Multi-head latent attention and a mixture of 4 routed experts (2 per token) after one
    dense layer, as DeepSeek-V3 is built."""
    return transformers.DeepseekV3Config(
        **(_COMMON | {"num_key_value_heads": 4}),
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=16,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        tie_word_embeddings=False,
    )


FAMILIES: tuple[Family, ...] = (
    Family("llama", "HfLlama", lambda: _llama(False), tied=False),
    Family("llama-tied", "HfLlama", lambda: _llama(True), tied=True),  # Llama-3.2, SmolLM2
    Family("qwen2", "HfAuto", lambda: _qwen2(False), tied=False),
    Family("qwen2-tied", "HfAuto", lambda: _qwen2(True), tied=True),  # Qwen2.5-0.5B/1.5B
    Family("gemma2", "HfAuto", _gemma2, tied=True),
    Family("mistral", "HfAuto", _mistral, tied=False),
    Family("gpt-neox", "HfAuto", _gpt_neox, tied=False),
    Family("phi3", "HfAuto", _phi3, tied=False),
    Family("deepseek-v3", "HfDeepseek", _deepseek_v3, tied=False),
)


def family(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def write_family(directory: Path, which: Family | str) -> Path:
    """Write the family's config.json into `directory` (created) and return it."""
    chosen = family(which) if isinstance(which, str) else which
    directory.mkdir(parents=True, exist_ok=True)
    chosen.build().save_pretrained(str(directory))
    return directory


@contextmanager
def short_directory() -> Iterator[Path]:
    """A fresh directory with a short path (under the system temp dir), removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="psyche-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
