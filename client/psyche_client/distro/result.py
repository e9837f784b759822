"""The transmitted DisTrO result: layout, compact binary format, strict decode, commitment.

One `DistroResult` is one trainer's compressed update for one batch of one step: for every
parameter (sorted by name) the packed top-k indices and the values in the run's value
format (bf16, 1-bit signs, or 2-bit or 4-bit codes with per-chunk statistics; see `values`).

Binary format (version 2; integers in the fixed header are big-endian, `varint` is unsigned
LEB128 in its shortest form):

    header   magic b"PSDR" | version u8 = 2 | value kind u8 (`values.ValueKind`: 0 = bf16,
             1 = one-bit, 2 = two-bit, 3 = two-bit codebook, 4 = four-bit)
             | step u32 | trainer_nonce u32 | batch start u64 | batch end u64
             | tensor count varint
    tensor   ndim varint | xshape: ndim varints | totalk varint | k varint
             | idx bytes (ceil(chunks*k*w/8), w = ceil(log2(totalk)) bits per index,
               bit-packed LSB-first, zero padding)
             | val bytes (`kind.codec.size(chunks, k)`; the layout is the kind's codec
               module's, see `values`)

Nothing else follows; `chunks = prod(xshape[:-2])` for matrices (`xshape[:-1]` for vectors).
Commitment (as the reference): `data_hash = SHA-256(step u32 BE || start u64 BE || end u64 BE
|| for each tensor: idx bytes || val bytes)`; it does not cover nonce, xshape, totalk or k.

`DistroResult.decode(data, layout)` checks everything against the locally expected
`ResultLayout` (format version, tensor count, xshape, totalk, k, value kind, exact lengths,
index range, no duplicate index inside a chunk, finite values, zero padding bits, no trailing
bytes) and raises `ResultDecodeError` naming the tensor and field at fault. Version 1 (u8/u16
indices) is refused with an error that says so.

API: `ValueKind`, `TensorLayout`, `ResultLayout.for_parameters(named_shapes, chunk, topk,
kind)`, `TensorPayload` (with cached `.indices()`, `.values(kind)` and
`.rms(kind)`),
`DistroResult(step, batch_id, trainer_nonce, value_kind, tensors)` with `.encode() -> bytes`,
`.decode(data, layout)`, `.data_hash() -> bytes`, `.payload_bytes() -> int`, and
`commitment_hash(step, batch_id, tensors) -> bytes`.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from psyche_common.batch_id import BatchId

from psyche_client.distro.chunking import encoded_shape
from psyche_client.distro.compress import effective_k, index_bytes, unpack_indices
from psyche_client.distro.influence import value_rms
from psyche_client.distro.values import ValueKind, dequantize, value_bytes
from psyche_client.distro.wire import Reader, ResultDecodeError, varint

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "DistroResult",
    "ResultDecodeError",
    "ResultLayout",
    "TensorLayout",
    "TensorPayload",
    "ValueKind",
    "commitment_hash",
]

MAGIC = b"PSDR"
FORMAT_VERSION = 2
_HEADER = struct.Struct(">4sBBIIQQ")
_MAX_NDIM = 8


@dataclass(frozen=True)
class TensorLayout:
    """What one parameter's entry must look like."""

    name: str
    shape: tuple[int, ...]
    xshape: tuple[int, ...]
    totalk: int
    k: int

    @property
    def tile_dims(self) -> int:
        return 2 if len(self.shape) >= 2 else 1

    @property
    def chunks(self) -> int:
        return math.prod(self.xshape[: -self.tile_dims])

    @property
    def count(self) -> int:
        """Coefficients transmitted for this tensor."""
        return self.chunks * self.k

    def idx_bytes(self) -> int:
        return index_bytes(self.count, self.totalk)

    def val_bytes(self, kind: ValueKind) -> int:
        return value_bytes(kind, self.chunks, self.k)


@dataclass(frozen=True)
class ResultLayout:
    """The expected layout of every result of a run: parameters in sorted-name order."""

    tensors: tuple[TensorLayout, ...]
    value_kind: ValueKind

    @classmethod
    def for_parameters(
        cls,
        named_shapes: Iterable[tuple[str, Sequence[int]]],
        chunk: int,
        topk: int,
        kind: ValueKind,
    ) -> ResultLayout:
        """Layout of results for these parameters whose values travel as `kind`."""
        tensors = []
        for name, shape in sorted(named_shapes, key=lambda item: item[0]):
            shape_t = tuple(int(d) for d in shape)
            xshape = encoded_shape(shape_t, chunk)
            tile_dims = 2 if len(shape_t) >= 2 else 1
            totalk = math.prod(xshape[-tile_dims:])
            tensors.append(TensorLayout(name, shape_t, xshape, totalk, effective_k(topk, totalk)))
        return cls(tuple(tensors), kind)

    def payload_bytes(self) -> int:
        """Index plus value bytes of one result (the section 1.10 formula)."""
        return sum(t.idx_bytes() + t.val_bytes(self.value_kind) for t in self.tensors)


@dataclass(frozen=True)
class TensorPayload:
    """One parameter's packed top-k indices and values."""

    xshape: tuple[int, ...]
    totalk: int
    k: int
    idx: bytes
    val: bytes

    @property
    def count(self) -> int:
        """Coefficients in this entry: chunks * k."""
        return math.prod(self.xshape) // self.totalk * self.k

    @cached_property
    def _indices(self) -> np.ndarray:
        unpacked = unpack_indices(self.idx, self.totalk, self.count).reshape(-1, self.k)
        unpacked.flags.writeable = False
        return unpacked

    def indices(self) -> np.ndarray:
        """Indices as a read-only int64 array `[chunks, k]` (unpacked once, then cached)."""
        return self._indices

    @cached_property
    def _values_cache(self) -> dict[ValueKind, np.ndarray]:
        return {}

    def values(self, kind: ValueKind) -> np.ndarray:
        """The values a receiver reads, as a read-only float64 array `[chunks, k]` (decoded
        once per kind, then cached); raises `ValueError` on malformed value bytes."""
        cached = self._values_cache.get(kind)
        if cached is None:
            cached = dequantize(self.val, kind, self.count // self.k, self.k)
            cached.flags.writeable = False
            self._values_cache[kind] = cached
        return cached

    @cached_property
    def _rms_cache(self) -> dict[ValueKind, float]:
        return {}

    def rms(self, kind: ValueKind) -> float:
        """Root mean square of `values(kind)` (`influence.value_rms`), computed once."""
        cached = self._rms_cache.get(kind)
        if cached is None:
            cached = self._rms_cache[kind] = value_rms(self.values(kind))
        return cached


def commitment_hash(step: int, batch_id: BatchId, tensors: Sequence[TensorPayload]) -> bytes:
    """SHA-256 over step, batch range and every tensor's idx and val bytes (the reference's)."""
    digest = hashlib.sha256()
    digest.update(struct.pack(">IQQ", step, batch_id.start, batch_id.end))
    for tensor in tensors:
        digest.update(tensor.idx)
        digest.update(tensor.val)
    return digest.digest()


@dataclass(frozen=True)
class DistroResult:
    step: int
    batch_id: BatchId
    trainer_nonce: int
    value_kind: ValueKind
    tensors: tuple[TensorPayload, ...]

    @cached_property
    def _commitment(self) -> bytes:
        return commitment_hash(self.step, self.batch_id, self.tensors)

    def data_hash(self) -> bytes:
        """The 32-byte commitment hash (computed once)."""
        return self._commitment

    def payload_bytes(self) -> int:
        return sum(len(t.idx) + len(t.val) for t in self.tensors)

    def encode(self) -> bytes:
        parts = [
            _HEADER.pack(
                MAGIC,
                FORMAT_VERSION,
                int(self.value_kind),
                self.step,
                self.trainer_nonce,
                self.batch_id.start,
                self.batch_id.end,
            ),
            varint(len(self.tensors)),
        ]
        for tensor in self.tensors:
            parts.append(varint(len(tensor.xshape)))
            parts.extend(varint(d) for d in tensor.xshape)
            parts.append(varint(tensor.totalk))
            parts.append(varint(tensor.k))
            parts.append(tensor.idx)
            parts.append(tensor.val)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes, layout: ResultLayout) -> DistroResult:
        """Parse and strictly validate `data` against `layout`; raises `ResultDecodeError`."""
        reader = Reader(bytes(data))
        magic, version, kind, step, nonce, start, end = reader.struct(_HEADER, "header")
        if magic != MAGIC:
            raise ResultDecodeError(f"not a DisTrO result: magic {magic!r}, expected {MAGIC!r}")
        if version != FORMAT_VERSION:
            raise ResultDecodeError(
                f"result format version {version} is not supported: this client reads only "
                f"version {FORMAT_VERSION} (bit-packed indices); every client of a run must "
                "run a psyche-py release with the same result format"
            )
        if kind not in (k.value for k in ValueKind):
            raise ResultDecodeError(f"unknown value kind {kind}")
        value_kind = ValueKind(kind)
        if value_kind != layout.value_kind:
            raise ResultDecodeError(
                f"value kind is {value_kind.name}, this run expects {layout.value_kind.name}"
            )
        if end < start:
            raise ResultDecodeError(f"batch range [{start}, {end}] has end < start")
        count = reader.varint("tensor count")
        if count != len(layout.tensors):
            raise ResultDecodeError(
                f"result has {count} tensors, the model has {len(layout.tensors)}"
            )
        tensors = tuple(_read_tensor(reader, expected, value_kind) for expected in layout.tensors)
        if reader.remaining():
            raise ResultDecodeError(f"{reader.remaining()} trailing bytes after the last tensor")
        return cls(step, BatchId(start, end), nonce, value_kind, tensors)


def _read_tensor(reader: Reader, expected: TensorLayout, kind: ValueKind) -> TensorPayload:
    where = f"tensor {expected.name!r}"
    ndim = reader.varint(f"{where} ndim")
    if ndim > _MAX_NDIM:
        raise ResultDecodeError(f"{where}: ndim {ndim} is too large")
    xshape = tuple(reader.varint(f"{where} xshape") for _ in range(ndim))
    if xshape != expected.xshape:
        raise ResultDecodeError(f"{where}: xshape {xshape}, expected {expected.xshape}")
    totalk = reader.varint(f"{where} totalk")
    if totalk != expected.totalk:
        raise ResultDecodeError(f"{where}: totalk {totalk}, expected {expected.totalk}")
    k = reader.varint(f"{where} k")
    if k != expected.k:
        raise ResultDecodeError(f"{where}: k {k}, expected {expected.k}")
    idx = reader.take(expected.idx_bytes(), f"{where} indices")
    val = reader.take(expected.val_bytes(kind), f"{where} values")
    payload = TensorPayload(xshape, totalk, k, idx, val)
    _check_indices(payload, where)
    try:
        payload.values(kind)
        if kind.codec.carries_magnitudes:
            payload.rms(kind)  # for the bounded-influence apply, here in the decoding thread
    except ValueError as exc:
        raise ResultDecodeError(f"{where}: {exc}") from exc
    return payload


def _check_indices(payload: TensorPayload, where: str) -> None:
    try:
        idx = payload.indices()
    except ValueError as exc:
        raise ResultDecodeError(f"{where}: {exc}") from exc
    if idx.size and int(idx.max()) >= payload.totalk:
        raise ResultDecodeError(
            f"{where}: index {int(idx.max())} out of range for {payload.totalk} coefficients"
        )
    if payload.k > 1:
        ordered = np.sort(idx, axis=-1)
        if (ordered[:, 1:] == ordered[:, :-1]).any():
            raise ResultDecodeError(f"{where}: a chunk lists the same coefficient twice")
