"""Model directories the benches build for themselves (bench/distro.py, bench/client.py).

`write_llama_134m(directory)` writes the ~134M-parameter Llama of issue 20 (hidden 768, 12
layers, 12 heads, intermediate 2048, vocabulary 32,000, untied embeddings) as a Hugging Face
directory with `config.json` only, built with transformers from a `LlamaConfig`; the client
and the benches load such a directory with a seeded initialisation (`load_model`). Returns
the directory.
"""

from __future__ import annotations

from pathlib import Path

LLAMA_134M = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "intermediate_size": 2048,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}


def write_llama_134m(directory: Path) -> Path:
    from transformers import LlamaConfig

    directory.mkdir(parents=True, exist_ok=True)
    LlamaConfig(**LLAMA_134M).save_pretrained(directory)
    return directory
