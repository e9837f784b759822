"""DisTrO (Psyche's DeMo variant): DCT + top-k compression of a decoupled momentum.

Modules: `chunking` (chunk sizes), `dct` (orthonormal DCT-II bases, tiled transform),
`compress` (top-k, index/value packing), `result` (binary result format, strict decode,
SHA-256 commitment), `optimizer` (`DistroOptimizer`: lookahead, generate, apply).
See docs/distro.md.
"""

from psyche_client.distro.chunking import chunk_size, encoded_shape, num_chunks, tile_shape
from psyche_client.distro.dct import DctTransform, dct_basis
from psyche_client.distro.optimizer import DistroOptimizer, DistroSettings, Generated, OwnResult
from psyche_client.distro.result import (
    DistroResult,
    ResultDecodeError,
    ResultLayout,
    TensorLayout,
    TensorPayload,
    ValueKind,
    commitment_hash,
)

__all__ = [
    "DctTransform",
    "DistroOptimizer",
    "DistroResult",
    "DistroSettings",
    "Generated",
    "OwnResult",
    "ResultDecodeError",
    "ResultLayout",
    "TensorLayout",
    "TensorPayload",
    "ValueKind",
    "chunk_size",
    "commitment_hash",
    "dct_basis",
    "encoded_shape",
    "num_chunks",
    "tile_shape",
]
