"""`DataServerConfig`: data.toml, the TCP data server's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from psyche_common.config._types import U8, U64, StrictModel
from psyche_common.config.enums import TokenSize


class DataServerConfig(StrictModel):
    """Where the data server's token files are and how they are cut and shuffled.

    `load_data_config` resolves a relative `dir` against the folder holding data.toml.
    """

    dir: Path
    """The folder of token files (`*.bin`, `*.ds`, `*.npy`); only its top-level files are
    read. Relative: to the folder holding data.toml."""
    token_size: TokenSize
    """Token width in the files (TwoBytes: u16, FourBytes: u32, little-endian)."""
    seq_len: Annotated[U64, Field(gt=0)]
    """Tokens per sample served; equal to the model's `max_seq_len`."""
    shuffle_seed: Annotated[tuple[U8, ...], Field(min_length=32, max_length=32)]
    """Seed (32 integers 0-255) of the one global shuffle of all samples."""

    @property
    def shuffle_seed_bytes(self) -> bytes:
        return bytes(self.shuffle_seed)

    def to_toml_dict(self) -> dict[str, Any]:
        return {
            "dir": str(self.dir),
            "token_size": self.token_size.value,
            "seq_len": self.seq_len,
            "shuffle_seed": list(self.shuffle_seed),
        }
