"""DisTrO (Psyche's DeMo variant): DCT + top-k compression of a decoupled momentum.

Modules: `chunking` (chunk sizes), `dct` (orthonormal DCT-II bases, tiled transform),
`compress` (top-k, index packing), `values` (value formats: one codec per kind, registered
by header byte in `values.kinds.ValueKind`),
`wire` (varints, bounds-checked reader), `result` (binary result format, strict decode,
SHA-256 commitment), `aggregate` (exact one-scatter aggregation of many results),
`influence` (per-tensor normalisation of bf16 / 2-bit results before aggregation),
`size` (the exact encoded size of every result of a layout),
`compressor` (buffer -> result and back, shared by the optimizers), `parameters` (what both
optimizers set up on the parameters), `optimizer`
(`DistroOptimizer`: lookahead, generate, apply), `in_flight` (whether the lookahead applies:
only after training the step before). See docs/distro.md.
"""

from psyche_client.distro.chunking import chunk_size, encoded_shape, num_chunks, tile_shape
from psyche_client.distro.compressor import Compressor, canonical_order
from psyche_client.distro.dct import DctTransform, dct_basis
from psyche_client.distro.optimizer import DistroOptimizer, DistroSettings, Generated, OwnResult
from psyche_client.distro.result import (
    DistroResult,
    ResultLayout,
    TensorLayout,
    TensorPayload,
    commitment_hash,
)
from psyche_client.distro.values import ValueKind
from psyche_client.distro.wire import ResultDecodeError

__all__ = [
    "Compressor",
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
    "canonical_order",
    "chunk_size",
    "commitment_hash",
    "dct_basis",
    "encoded_shape",
    "num_chunks",
    "tile_shape",
]
