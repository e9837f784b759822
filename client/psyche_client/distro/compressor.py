"""The compression both DisTrO-style optimizers share: per-parameter buffer -> result, and back.

A `Compressor` is built for one model (parameters in ascending name order) and one setting of
chunk, top-k and value kind. `compress(i, buffer)` takes parameter i's buffer (DisTrO's
momentum, SparseLoCo's error-feedback accumulator) through the tiled DCT, the top-k per chunk
and the value quantizer. `densify(i, idx, val, like)` is the inverse DCT of one sparse set of
coefficients (a client's own previous result, for error feedback and lookahead).
`aggregated_signs(i, payloads)` is DisTrO's update direction: the sign of the inverse DCT of
all received results' coefficients of parameter i, aggregated exactly (`aggregate`) and
transformed on integers (`exact_idct`), so it is the same on every device.
`aggregated(i, payloads, ...)` is SparseLoCo's: the float64 inverse DCT (as tiles;
`untile(i, tiles)` reshapes), whose float sums may differ between devices only within ~1e-16
of a value. Results whose values carry magnitudes
(every format but 1-bit: `ValueCodec.carries_magnitudes`) are first normalised per tensor to a common RMS (`influence`; with
`clip_influence` only scaled down to it), so no single result outweighs a typical one;
with `dct=False` the tiles are taken as they are, untransformed (SparseLoCo only: DisTrO's
exact sign decoder inverts a DCT); one-bit results are aggregated as they are. `check(result)` compares a result's
value kind and per-tensor layout with the local model's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from psyche_client.distro.aggregate import aggregate, aggregate_sparse
from psyche_client.distro.compress import pack_indices, topk_per_chunk
from psyche_client.distro.dct import DctTransform
from psyche_client.distro.exact_idct import ExactSignDecoder
from psyche_client.distro.influence import influence_scales
from psyche_client.distro.result import DistroResult, ResultLayout, TensorPayload
from psyche_client.distro.values import ValueKind, quantize

_ENCODE_BLOCK = 1 << 18  # elements of one encode block (1 MiB of float32)


@dataclass(frozen=True)
class Compressed:
    """One parameter's entry: what is sent, the kept coefficients, and what receivers read."""

    payload: TensorPayload
    idx: torch.Tensor  # int64 [chunks, k]
    val: torch.Tensor  # the kept coefficients as computed, buffer dtype
    sent: torch.Tensor  # the values a receiver reads back, buffer dtype


class Compressor:
    def __init__(
        self,
        named_shapes: Iterable[tuple[str, Sequence[int]]],
        chunk: int,
        topk: int,
        kind: ValueKind,
        *,
        clip_influence: bool = False,
        dct: bool = True,
    ) -> None:
        self.topk = topk
        self.clip_influence = clip_influence
        self.layout = ResultLayout.for_parameters(named_shapes, chunk, topk, kind)
        self.transform = DctTransform(chunk, identity=not dct)
        self.sign_decoder = ExactSignDecoder()

    @property
    def kind(self) -> ValueKind:
        return self.layout.value_kind

    def compress(self, i: int, buffer: torch.Tensor) -> Compressed:
        expected = self.layout.tensors[i]
        idx, val = self._encode_topk(buffer, expected.tile_dims, expected.xshape)
        packed_val, sent = quantize(val, self.kind)
        payload = TensorPayload(
            expected.xshape,
            expected.totalk,
            expected.k,
            pack_indices(idx, expected.totalk),
            packed_val,
        )
        return Compressed(payload, idx, val, sent)

    def _encode_topk(
        self, buffer: torch.Tensor, tile_dims: int, xshape: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DCT and top-k per chunk, over blocks of whole tile rows of a large matrix (so that
        the DCT's output, its magnitudes and the selection stay in cache); the chunks come
        out in the same order as from one pass."""
        if tile_dims == 1 or buffer.numel() <= _ENCODE_BLOCK:
            idx, val = topk_per_chunk(self.transform.encode(buffer), self.topk, tile_dims)
            return idx, val
        n1 = xshape[-2]
        rows = buffer.reshape(-1, buffer.shape[-1])
        step = max(1, _ENCODE_BLOCK // (n1 * rows.shape[1])) * n1
        parts = [
            topk_per_chunk(self.transform.encode(rows[first : first + step]), self.topk, 2)
            for first in range(0, rows.shape[0], step)
        ]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def coefficients(self, i: int, buffer: torch.Tensor) -> torch.Tensor:
        """Parameter i's buffer through the tiled DCT, one tile per row: `[chunks, totalk]`
        (the statistics of `--optim-stats-steps` only; `compress` does not keep them)."""
        expected = self.layout.tensors[i]
        return self.transform.encode(buffer).reshape(-1, expected.totalk)

    def densify(
        self, i: int, idx: torch.Tensor, val: torch.Tensor, like: torch.Tensor
    ) -> torch.Tensor:
        """Inverse DCT of one result's sparse coefficients, in `like`'s dtype and device."""
        expected = self.layout.tensors[i]
        dense = torch.zeros(
            (expected.chunks, expected.totalk), dtype=like.dtype, device=like.device
        )
        dense.scatter_(-1, idx.to(like.device), val.to(device=like.device, dtype=like.dtype))
        return self.transform.decode(dense.view(expected.xshape), expected.shape)

    def aggregated_signs(
        self, i: int, payloads: Sequence[TensorPayload], *, device: torch.device
    ) -> torch.Tensor:
        """DisTrO's update direction for parameter i: the sign (float32 -1/0/+1, the
        parameter's shape) of the integer inverse DCT of the scatter-mean of `payloads`
        (`exact_idct`), the same on every device."""
        expected = self.layout.tensors[i]
        positions, means = aggregate_sparse(
            payloads,
            self.kind,
            expected.totalk,
            mean_over_all=False,
            device=device,
            scales=self._scales(payloads),
        )
        return self.sign_decoder.signs(positions, means, expected, device)

    def _scales(self, payloads: Sequence[TensorPayload]) -> list[float] | None:
        if not self.kind.codec.carries_magnitudes:
            return None
        return influence_scales([p.rms(self.kind) for p in payloads], clip=self.clip_influence)

    def aggregated(
        self,
        i: int,
        payloads: Sequence[TensorPayload],
        *,
        mean_over_all: bool,
        device: torch.device,
    ) -> torch.Tensor:
        """Parameter i's aggregated update as float64 tiles (the inverse DCT in the encoded
        layout); `untile(i, tiles)` puts them in the parameter's shape."""
        expected = self.layout.tensors[i]
        coefficients = aggregate(
            payloads,
            self.kind,
            expected.chunks,
            expected.totalk,
            mean_over_all=mean_over_all,
            device=device,
            scales=self._scales(payloads),
        )
        return self.transform.decode_tiles(coefficients.view(expected.xshape), expected.shape)

    def untile(self, i: int, tiles: torch.Tensor) -> torch.Tensor:
        return self.transform.untile(tiles, self.layout.tensors[i].shape)

    def check(self, result: DistroResult) -> None:
        """Raise `ValueError` unless `result` fits this model and value kind."""
        layout = self.layout
        if result.value_kind != layout.value_kind:
            raise ValueError(
                f"result for {result.batch_id} has value kind "
                f"{result.value_kind.name}, expected {layout.value_kind.name}"
            )
        if len(result.tensors) != len(layout.tensors):
            raise ValueError(
                f"result for {result.batch_id} has {len(result.tensors)} tensors, "
                f"expected {len(layout.tensors)}"
            )
        for payload, expected in zip(result.tensors, layout.tensors, strict=True):
            got = (payload.xshape, payload.totalk, payload.k)
            want = (expected.xshape, expected.totalk, expected.k)
            if got != want:
                raise ValueError(
                    f"result for {result.batch_id}: tensor {expected.name!r} has "
                    f"layout {got[0]}/{got[1]}/{got[2]}, expected {want[0]}/{want[1]}/{want[2]}"
                )


def canonical_order(results: Iterable[DistroResult]) -> list[DistroResult]:
    """Results sorted by batch id, then commitment hash: the order every client applies."""
    return sorted(results, key=lambda r: (r.batch_id.start, r.batch_id.end, r.data_hash()))
