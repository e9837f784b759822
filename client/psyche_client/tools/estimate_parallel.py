"""Memory per device of a multi-device client, for `psyche-client check --data-parallelism N
[--fsdp]` (the layouts are those of `psyche_client.training.parallel`).

* replicated (data parallelism over full copies): every device holds what a single-device
  client holds (DisTrO's momentum in fp32; the early apply's weights snapshot is rank 0's
  only), plus the fp32 bucket its gradients are summed through;
* sharded (`--fsdp`, N ranks): a device holds its rows of every parameter and gradient
  (`shard_rows`), the full copies and DisTrO momentum of the parameters it owns (the largest
  rank's share from `assign_owners`), and while training the unsharded parameters and
  gradients of the root module's own parameters (the final norm) and of two sharding units
  (`fsdp_units`: a decoder layer, an embedding, or tied embeddings together; the one running
  and the one prefetched, counted at the largest unit's size), plus one full parameter and one
  full fp32 gradient for the lookahead and `generate`.

Activations (one micro-batch), the process baseline and the results held are the caller's, as
on a single device. In the sharded mode the early apply's weights snapshot (the whole model,
gathered as bytes on rank 0's host) is not a device's and is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from psyche_client.distro.parameters import STATE_DTYPE
from psyche_client.training.parallel.collectives import BUCKET_ELEMENTS
from psyche_client.training.parallel.plan import (
    ParallelSpec,
    assign_owners,
    owned_elements,
    shard_rows,
)
from psyche_client.training.parallel.units import fsdp_units

STATE_BYTES = torch.empty((), dtype=STATE_DTYPE).element_size()


def unit_parameters(model: torch.nn.Module) -> tuple[list[int], int]:
    """Elements of each sharding unit (`fsdp_units`) and of the root's own parameters."""
    units = [
        sum(p.numel() for p in {id(p): p for m in unit for p in m.parameters()}.values())
        for unit in fsdp_units(model)
    ]
    total = sum(p.numel() for p in model.parameters())
    return units, total - sum(units)


def shard_elements(shapes: Sequence[tuple[int, ...]], ranks: int) -> int:
    """Elements of the largest rank's dimension-0 shards over all parameters."""
    largest = 0
    for rank in range(ranks):
        held = 0
        for shape in shapes:
            start, end = shard_rows(shape[0], ranks)[rank]
            held += (end - start) * math.prod(shape[1:])
        largest = max(largest, held)
    return largest


def per_device_memory(
    model: torch.nn.Module, spec: ParallelSpec, elem: int, distro: bool
) -> list[tuple[str, int]]:
    """Rows `(label, bytes)` for one device of the multi-device client (without activations)."""
    named = sorted((name, tuple(p.shape)) for name, p in model.named_parameters())
    total = sum(math.prod(shape) for _, shape in named)
    if not spec.fsdp:
        weights = total * elem
        rows = [("parameters", weights), ("gradients", weights)]
        if distro:
            rows += [
                ("DisTrO momentum (fp32)", total * STATE_BYTES),
                ("saved weights (lookahead undo)", weights),
                ("weights snapshot (early apply, rank 0)", weights),
            ]
        rows.append(("gradient all-reduce bucket (fp32)", min(total, BUCKET_ELEMENTS) * 4))
        return rows
    ranks = spec.world_size
    sizes = {name: math.prod(shape) for name, shape in named}
    shards = shard_elements([shape for _, shape in named], ranks) * elem
    owned = max(owned_elements(assign_owners(sizes, ranks), sizes, ranks)) * elem
    units, root = unit_parameters(model)
    unsharded = (root + 2 * max(units, default=0)) * elem
    largest = max(sizes.values(), default=0)
    rows = [
        ("parameter shards", shards),
        ("gradient shards", shards),
        ("full copies of owned parameters", owned),
    ]
    if distro:
        owned_state = owned // elem * STATE_BYTES
        rows.append(("DisTrO momentum (owned parameters, fp32)", owned_state))
    rows += [
        ("unsharded root + 2 units (params + grads)", 2 * unsharded),
        ("one full parameter + fp32 gradient", largest * (elem + 4)),
    ]
    return rows
