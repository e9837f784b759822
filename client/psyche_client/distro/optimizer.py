"""The DisTrO optimizer: lookahead, `generate` (momentum -> DCT -> top-k) and `apply`.

Reference: spec sections 1.5 and 1.6, with three fixes for determinism (docs/deviations.md):
the lookahead is undone by restoring saved weights, weight decay runs in `apply` (so every
client applying the same results decays identically), and results are applied in canonical
batch-id order.

Per parameter (sorted by name) the optimizer keeps a momentum `delta` (zeros, parameter dtype).

    with opt.lookahead(prev_lr):          # theta -= prev_lr * sign(delta); restored on exit
        forward/backward                  # grads in p.grad
    generated = opt.generate(lr, step, batch_id, trainer_nonce, own_previous)
        # delta <- beta * (delta - decode(own_previous)) + lr * grad, then encode + top-k;
        # generated.transmit is the DistroResult to publish (bf16 or 1-bit values),
        # generated.own the unquantized copy to pass as own_previous next time.
    opt.apply(results, lr)                # mean per coefficient over the results that chose
                                          # it, inverse DCT, theta -= lr * sign(.)

API: `DistroSettings` (+ `from_config(obj)` for the pydantic `Distro` optimizer model),
`OwnResult`, `Generated`, `DistroOptimizer(named_parameters, settings)` with `.layout`,
`.lookahead(prev_lr)`, `.generate(...)`, `.apply(results, lr) -> int`, `.zero_momentum()`,
`.momentum(name)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from psyche_common.assignment import BatchId

from psyche_client.distro.compress import (
    pack_bf16,
    pack_indices,
    pack_signs,
    topk_per_chunk,
    unpack_bf16,
    unpack_signs,
)
from psyche_client.distro.dct import DctTransform
from psyche_client.distro.result import (
    DistroResult,
    ResultLayout,
    TensorLayout,
    TensorPayload,
    ValueKind,
)


@dataclass(frozen=True)
class DistroSettings:
    """The knobs of `OptimizerDefinition::Distro` (spec section 1.1)."""

    compression_decay: float
    compression_topk: int
    compression_chunk: int
    quantize_1bit: bool
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None

    def __post_init__(self) -> None:
        if self.compression_topk < 1:
            raise ValueError(f"compression_topk must be >= 1, got {self.compression_topk}")
        if self.compression_chunk < 1:
            raise ValueError(f"compression_chunk must be >= 1, got {self.compression_chunk}")

    @classmethod
    def from_config(cls, config: Any) -> DistroSettings:
        """From any object with the Distro fields (the pydantic config model included)."""
        return cls(
            compression_decay=float(config.compression_decay),
            compression_topk=int(config.compression_topk),
            compression_chunk=int(config.compression_chunk),
            quantize_1bit=bool(config.quantize_1bit),
            weight_decay=float(config.weight_decay or 0.0),
            clip_grad_norm=config.clip_grad_norm,
        )


@dataclass(frozen=True)
class OwnResult:
    """A client's own result before quantization: per parameter `(idx, val)`, `[chunks, k]`."""

    tensors: tuple[tuple[torch.Tensor, torch.Tensor], ...]


@dataclass(frozen=True)
class Generated:
    transmit: DistroResult
    own: OwnResult


class DistroOptimizer:
    def __init__(
        self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]], settings: DistroSettings
    ) -> None:
        self.settings = settings
        self._params = sorted(named_parameters, key=lambda item: item[0])
        names = [name for name, _ in self._params]
        if len(set(names)) != len(names):
            raise ValueError("parameter names must be unique")
        self.layout = ResultLayout.for_parameters(
            ((name, tuple(p.shape)) for name, p in self._params),
            settings.compression_chunk,
            settings.compression_topk,
            settings.quantize_1bit,
        )
        self.transform = DctTransform(settings.compression_chunk)
        self._delta = {
            name: torch.zeros_like(p, memory_format=torch.contiguous_format)
            for name, p in self._params
        }

    # ---- state -------------------------------------------------------------------------
    def zero_momentum(self) -> None:
        for delta in self._delta.values():
            delta.zero_()

    def momentum(self, name: str) -> torch.Tensor:
        return self._delta[name]

    # ---- lookahead ---------------------------------------------------------------------
    @contextmanager
    def lookahead(self, prev_lr: float) -> Iterator[None]:
        """Train at `theta - prev_lr * sign(delta)`; the exact weights are restored on exit."""
        saved = [p.detach().clone() for _, p in self._params]
        try:
            with torch.no_grad():
                if prev_lr != 0.0:
                    for name, p in self._params:
                        p.add_(torch.sign(self._delta[name]), alpha=-prev_lr)
            yield
        finally:
            with torch.no_grad():
                for (_, p), original in zip(self._params, saved, strict=True):
                    p.copy_(original)

    # ---- generate ----------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        lr: float,
        step: int,
        batch_id: BatchId,
        trainer_nonce: int,
        own_previous: Sequence[OwnResult] = (),
    ) -> Generated:
        """Fold the gradients in `p.grad` into the momentum and compress it (spec 1.5)."""
        beta = self.settings.compression_decay
        topk = self.settings.compression_topk
        one_bit = self.settings.quantize_1bit
        payloads: list[TensorPayload] = []
        own: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, ((name, p), expected) in enumerate(
            zip(self._params, self.layout.tensors, strict=True)
        ):
            delta = self._delta[name]
            for previous in own_previous:
                idx, val = previous.tensors[i]
                delta.sub_(self._densify(expected, idx, val, delta.dtype, delta.device))
            if beta != 1.0:
                delta.mul_(beta)
            if p.grad is not None:
                delta.add_(p.grad.to(delta.dtype), alpha=lr)
            encoded = self.transform.encode(delta)
            idx, val = topk_per_chunk(encoded, topk, expected.tile_dims)
            own.append((idx, val))
            packed_val = pack_signs(val) if one_bit else pack_bf16(val)
            payloads.append(
                TensorPayload(
                    expected.xshape,
                    expected.totalk,
                    expected.k,
                    pack_indices(idx, expected.totalk),
                    packed_val,
                )
            )
        transmit = DistroResult(
            step, batch_id, trainer_nonce, self.layout.value_kind, tuple(payloads)
        )
        return Generated(transmit, OwnResult(tuple(own)))

    def _densify(
        self,
        expected: TensorLayout,
        idx: torch.Tensor,
        val: torch.Tensor,
        dtype: torch.dtype,
        device: torch.device,
    ) -> torch.Tensor:
        """Inverse DCT of a single result's sparse coefficients (scatter, no averaging)."""
        dense = torch.zeros((expected.chunks, expected.totalk), dtype=dtype, device=device)
        dense.scatter_(-1, idx.to(device), val.to(device=device, dtype=dtype))
        return self.transform.decode(dense.view(expected.xshape), expected.shape)

    # ---- apply -------------------------------------------------------------------------
    @torch.no_grad()
    def apply(self, results: Sequence[DistroResult], lr: float) -> int:
        """Apply `results` (any order; sorted canonically here). Returns how many were used.

        Every client that applies the same set of results with the same lr ends with
        bit-identical weights: the order is canonical and no kernel uses atomics on
        colliding indices (each scatter adds one result, whose indices per chunk are unique).
        """
        if not results:
            return 0
        ordered = sorted(results, key=_canonical_key)
        for result in ordered:
            self._check_layout(result)
        one_bit = self.layout.value_kind == ValueKind.ONE_BIT
        weight_decay = self.settings.weight_decay
        for i, ((_, p), expected) in enumerate(zip(self._params, self.layout.tensors, strict=True)):
            total = torch.zeros(
                (expected.chunks, expected.totalk), dtype=torch.float32, device=p.device
            )
            count = torch.zeros_like(total)
            for result in ordered:
                payload = result.tensors[i]
                idx = torch.tensor(payload.indices(), device=p.device)
                if one_bit:
                    val = unpack_signs(payload.val, expected.count)
                else:
                    val = unpack_bf16(payload.val).to(torch.float32)
                val = val.reshape(expected.chunks, expected.k).to(p.device)
                total.scatter_add_(-1, idx, val)
                count.scatter_add_(-1, idx, torch.ones_like(val))
            mean = torch.where(count > 0, total / count.clamp_min(1.0), torch.zeros_like(total))
            update = self.transform.decode(mean.to(p.dtype).view(expected.xshape), expected.shape)
            if weight_decay != 0.0:
                p.mul_(1.0 - lr * weight_decay)
            p.add_(torch.sign(update), alpha=-lr)
        return len(ordered)

    def _check_layout(self, result: DistroResult) -> None:
        if result.value_kind != self.layout.value_kind:
            raise ValueError(
                f"result for {result.batch_id} has value kind "
                f"{result.value_kind.name}, expected {self.layout.value_kind.name}"
            )
        if len(result.tensors) != len(self.layout.tensors):
            raise ValueError(
                f"result for {result.batch_id} has {len(result.tensors)} tensors, "
                f"expected {len(self.layout.tensors)}"
            )
        for payload, expected in zip(result.tensors, self.layout.tensors, strict=True):
            if (payload.xshape, payload.totalk, payload.k) != (
                expected.xshape,
                expected.totalk,
                expected.k,
            ):
                raise ValueError(
                    f"result for {result.batch_id}: tensor {expected.name!r} has "
                    f"layout {payload.xshape}/{payload.totalk}/{payload.k}, expected "
                    f"{expected.xshape}/{expected.totalk}/{expected.k}"
                )


def _canonical_key(result: DistroResult) -> tuple[int, int, bytes]:
    return (result.batch_id.start, result.batch_id.end, result.data_hash())
