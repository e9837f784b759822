"""The DisTrO optimizer: lookahead, `generate` (momentum -> DCT -> top-k) and `apply`.

Reference: spec sections 1.5 and 1.6, with fixes for determinism (docs/deviations.md): the
lookahead moves along the sign of the trainer's own published result, not of its momentum
(`lookahead`: a point a verifier can recompute), and is undone by restoring saved weights, weight decay runs in `apply` (so every client
applying the same results decays identically), results are applied in canonical batch-id
order, their coefficients are summed exactly and the sign of the inverse DCT of the aggregate
is that of an exact integer transform (`exact_idct`), the same on every device.

Per parameter (sorted by name) the optimizer keeps a momentum `delta` (zeros, float32 whatever
the parameter dtype: it accumulates small contributions over many steps and carries the error
feedback, which bf16 would round away; the parameters, their gradients and the lookahead's
saved copy keep the parameter dtype).

    with opt.lookahead(prev_lr, own_published):  # theta -= prev_lr * sign(IDCT(own result of
                                          # the step before, as published)); restored on exit
        forward/backward                  # grads in p.grad
    generated = opt.generate(lr, step, batch_id, trainer_nonce, own_previous)
        # delta <- beta * (delta - decode(own_previous)) + lr * grad, then encode + top-k;
        # generated.transmit is the DistroResult to publish (bf16, 1-bit or 2-bit values),
        # generated.own the unquantized copy to pass as own_previous next time.
    opt.apply(results, lr)                # mean per coefficient over the results that chose
                                          # it, inverse DCT, theta -= lr * sign(.)

With `aggregate_momentum` (beta > 0; study only, see below) apply keeps a second float32
buffer `m` per parameter and, with `s` the sign of the aggregate above, does
`m <- beta * m + (1 - beta) * s` (two separate elementwise ops) and
`theta <- theta * (1 - lr * wd) - lr * m`. It costs no bytes: `m` is a function of the applied
results only, so it is bit-identical on every client that applied the same results (with the
same lr) from the start. A client that joins later, with weights fetched from a peer, does not
have it: model sharing does not carry it. So the run config does NOT offer this setting (no
field in the pydantic config, not read by `from_config`); it is a study-only setting
(`DistroSettings(aggregate_momentum=...)` built by hand) until model sharing carries the
buffer. At 0.0 (the default) apply is exactly the plain sign step.

API: `DistroSettings` (+ `from_config(obj)` for the pydantic `Distro` optimizer model),
`OwnResult`, `Generated`, `DistroOptimizer(named_parameters, settings)` with `.layout`,
`.lookahead(prev_lr, along)`, `.generate(...)`, `.apply(results, lr) -> int`, `.zero_momentum()`,
`.momentum(name)`, `.aggregate_momentum_buffer(name)`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from psyche_common.batch_id import BatchId
from psyche_common.config import DistroOptimizer as DistroConfig
from psyche_common.config.optimizer import DISTRO_CLASHES, DISTRO_SPELLINGS
from psyche_common.config.value_format import resolve_value_format

from psyche_client.distro.compressor import canonical_order
from psyche_client.distro.lookahead import move_along
from psyche_client.distro.parameters import compressed_parameters, zero_buffers
from psyche_client.distro.result import DistroResult, ResultLayout
from psyche_client.distro.stats import l1_energy, mean_captured_energy
from psyche_client.distro.values import ValueKind, value_kind_named


@dataclass(frozen=True)
class DistroSettings:
    """The knobs of `OptimizerDefinition::Distro` (spec section 1.1), plus `quantize_2bit`
    (2-bit values with a bf16 scale per chunk; ours, not the reference's) and
    `aggregate_momentum` (ours; study only: a momentum on the applied sign aggregate, in
    [0, 1), 0 = off). The run config does not offer `aggregate_momentum` and `from_config`
    never sets it: a client joining with weights fetched from a peer would not have the
    buffer, so it stays a study-only setting until model sharing carries the buffer."""

    compression_decay: float
    compression_topk: int
    compression_chunk: int
    quantize_1bit: bool
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None
    quantize_2bit: bool = False
    aggregate_momentum: float = 0.0

    def __post_init__(self) -> None:
        if self.compression_topk < 1:
            raise ValueError(f"compression_topk must be >= 1, got {self.compression_topk}")
        if self.compression_chunk < 1:
            raise ValueError(f"compression_chunk must be >= 1, got {self.compression_chunk}")
        self.value_kind  # noqa: B018  (raises ValueFormatConflict on clashing booleans)
        if not 0.0 <= self.aggregate_momentum < 1.0:
            raise ValueError(f"aggregate_momentum must be in [0, 1), got {self.aggregate_momentum}")

    @property
    def value_kind(self) -> ValueKind:
        """The value format the booleans spell (as in a Distro table without `value_format`)."""
        given = {"quantize_1bit": self.quantize_1bit, "quantize_2bit": self.quantize_2bit}
        named = resolve_value_format(
            "DistroSettings", None, given, DISTRO_SPELLINGS, DISTRO_CLASHES
        )
        return value_kind_named(named)

    @classmethod
    def from_config(cls, config: DistroConfig) -> DistroSettings:
        """From the run config's `Distro` optimizer table (its value format spelled by the
        booleans these settings keep)."""
        spelled = DISTRO_SPELLINGS[config.resolved_value_format()]
        return cls(
            compression_decay=float(config.compression_decay),
            compression_topk=int(config.compression_topk),
            compression_chunk=int(config.compression_chunk),
            quantize_1bit=spelled["quantize_1bit"],
            weight_decay=float(config.weight_decay or 0.0),
            clip_grad_norm=config.clip_grad_norm,
            quantize_2bit=spelled["quantize_2bit"],
        )


@dataclass(frozen=True)
class OwnResult:
    """A client's own result as error feedback needs it: per parameter `(idx, val)`,
    `[chunks, k]` (DisTrO: the values before quantization)."""

    tensors: tuple[tuple[torch.Tensor, torch.Tensor], ...]


@dataclass(frozen=True)
class Generated:
    transmit: DistroResult
    own: OwnResult
    stats: dict[str, float] = field(default_factory=dict)
    """With `generate(..., stats=True)`: per parameter `{name}.grad_energy` (L1 of the
    gradient), `{name}.delta_energy` (L1 of the momentum after the gradient was folded in) and
    `{name}.captured_energy` (the mean over tiles of the DCT energy share top-k kept)."""


class DistroOptimizer:
    def __init__(
        self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]], settings: DistroSettings
    ) -> None:
        self.settings = settings
        self._params, self.compressor = compressed_parameters(named_parameters, settings)
        names = [name for name, _ in self._params]
        self._delta = dict(zip(names, zero_buffers(self._params), strict=True))
        self._aggregate: dict[str, torch.Tensor] = {}
        if settings.aggregate_momentum > 0.0:
            self._aggregate = dict(zip(names, zero_buffers(self._params), strict=True))

    @property
    def layout(self) -> ResultLayout:
        return self.compressor.layout

    # ---- state -------------------------------------------------------------------------
    def zero_momentum(self) -> None:
        for delta in self._delta.values():
            delta.zero_()
        for buffer in self._aggregate.values():
            buffer.zero_()

    def momentum(self, name: str) -> torch.Tensor:
        return self._delta[name]

    def aggregate_momentum_buffer(self, name: str) -> torch.Tensor:
        """The momentum on the applied aggregate of `name` (only with `aggregate_momentum`)."""
        if not self._aggregate:
            raise ValueError("aggregate_momentum is 0: there is no aggregate momentum buffer")
        return self._aggregate[name]

    # ---- lookahead ---------------------------------------------------------------------
    @contextmanager
    def lookahead(self, prev_lr: float, along: DistroResult | None) -> Iterator[None]:
        """Train at `theta - prev_lr * sign(IDCT(along))`, `along` this client's own published
        result still in flight (its last of the step before); the exact weights are restored
        on exit. Nothing moves when `prev_lr` is 0 or `along` is None. The direction is the
        one `lookahead_signs` gives, from a public result, so a verifier can recompute the
        gradient at the very point the trainer trained at (docs/verification.md)."""
        if prev_lr == 0.0 or along is None:
            yield
            return
        saved = [p.detach().clone() for _, p in self._params]
        try:
            move_along(self._params, self.compressor, along, prev_lr)
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
        *,
        stats: bool = False,
    ) -> Generated:
        """Fold the gradients in `p.grad` into the momentum and compress it (spec 1.5);
        `stats`: also measure each parameter (`Generated.stats`, extra work on this call)."""
        beta = self.settings.compression_decay
        measured: dict[str, float] = {}
        payloads = []
        own: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, (name, p) in enumerate(self._params):
            delta = self._delta[name]
            for previous in own_previous:
                idx, val = previous.tensors[i]
                delta.sub_(self.compressor.densify(i, idx, val, delta))
            if beta != 1.0:
                delta.mul_(beta)
            if p.grad is not None:
                delta.add_(p.grad.to(delta.dtype), alpha=lr)
            compressed = self.compressor.compress(i, delta)
            own.append((compressed.idx, compressed.val))
            payloads.append(compressed.payload)
            if stats:
                measured[f"{name}.grad_energy"] = 0.0 if p.grad is None else l1_energy(p.grad)
                measured[f"{name}.delta_energy"] = l1_energy(delta)
                measured[f"{name}.captured_energy"] = mean_captured_energy(
                    self.compressor.coefficients(i, delta), compressed.val
                )
        transmit = DistroResult(
            step, batch_id, trainer_nonce, self.compressor.kind, tuple(payloads)
        )
        return Generated(transmit, OwnResult(tuple(own)), measured)

    # ---- apply -------------------------------------------------------------------------
    @torch.no_grad()
    def apply(self, results: Sequence[DistroResult], lr: float) -> int:
        """Apply `results` (any order; sorted canonically here). Returns how many were used.

        Per parameter: every coefficient is the mean over the results that chose it (one
        exact float64 scatter for all results), then the sign of the integer inverse DCT
        (`exact_idct`), then
        `theta <- theta * (1 - lr * wd) - lr * sign(.)`; with `aggregate_momentum` beta > 0,
        `m <- beta * m + (1 - beta) * sign(.)` and `theta <- theta * (1 - lr * wd) - lr * m`.
        Clients applying the same sequence of result sets with the same lrs get bit-identical
        weights (and `m`).
        """
        if not results:
            return 0
        ordered = canonical_order(results)
        for result in ordered:
            self.compressor.check(result)
        weight_decay = self.settings.weight_decay
        beta = self.settings.aggregate_momentum
        for i, (name, p) in enumerate(self._params):
            signs = self.compressor.aggregated_signs(
                i, [result.tensors[i] for result in ordered], device=p.device
            )
            update = signs
            if self._aggregate:
                update = self._aggregate[name]
                update.mul_(beta).add_(signs, alpha=1.0 - beta)
            if weight_decay != 0.0:
                p.mul_(1.0 - lr * weight_decay)
            p.add_(update.to(p.dtype), alpha=-lr)
        return len(ordered)
