"""The local provider: token files in one directory, for the TCP data server and for clients.

The directory's top-level ``.ds``/``.bin``/``.npy`` files are taken in name order (the
reference uses directory-listing order, which differs between machines), memory-mapped, cut
into ``seq_len`` sequences and optionally shuffled with a 32-byte seed (see ``token_files``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from psyche_common.config.enums import TokenSize
from psyche_common.data.sequence_index import parse_shuffle
from psyche_common.data.token_files import (
    TokenSequences,
    TokenSequencesProvider,
    list_token_files,
    parse_token_size,
)

logger = logging.getLogger(__name__)


class LocalDataProvider(TokenSequencesProvider):
    """Sequences from the token files of ``directory``.

    ``shuffle`` is anything ``parse_shuffle`` accepts: None / "DontShuffle", 32 seed bytes, a
    list of 32 ints or the config's ``SeededShuffle``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        token_size: TokenSize | str | int,
        seq_len: int,
        shuffle: object = None,
    ) -> None:
        self.directory = Path(directory).expanduser().resolve()
        self.token_size = parse_token_size(token_size)
        self.files = list_token_files(self.directory)
        self.sequences = TokenSequences.from_files(
            self.files, self.token_size, seq_len, parse_shuffle(shuffle), str(self.directory)
        )
        self.seq_len = seq_len
        total_bytes = sum(f.stat().st_size for f in self.files)
        logger.info(
            "Loaded %d files (%d bytes) from %s: %d sequences of %d tokens",
            len(self.files),
            total_bytes,
            self.directory,
            self.sequences.num_sequences,
            seq_len,
            extra={"files": len(self.files), "bytes": total_bytes},
        )

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.sequences)

    def __repr__(self) -> str:
        return (
            f"LocalDataProvider({str(self.directory)!r}, {self.token_size.value}, "
            f"seq_len={self.seq_len}, shuffled={self.sequences.shuffle_seed is not None})"
        )
