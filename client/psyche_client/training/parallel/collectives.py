"""The collectives a multi-device client's ranks use, in the shapes its engines need.

* `DataParallelSync`: the trainer's `GradientSync` over the ranks (a stop flag in the store,
  then one meeting point: the stop decision, gradient and loss sums in fp32 buckets);
* `agree`: every rank contributes a digest; a mismatch raises `RankMismatch` naming the rank;
* `scatter_rows` / `gather_rows`: move a parameter between its full form on one rank and the
  dimension-0 shards of every rank (the `plan.shard_rows` layout);
* `send_tensor`, `broadcast_object`, `ping`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from psyche_client.training.parallel.launch import RankGroups
from psyche_client.training.parallel.plan import first_mismatch

BUCKET_ELEMENTS = 1 << 24  # fp32 elements per gradient all-reduce (64 MiB)


class RankMismatch(RuntimeError):
    """Two ranks that must hold the same state do not (the message names the rank)."""


class DataParallelSync:
    """`GradientSync` for ranks that each hold a full replica. A rank that stops sets the
    store key `key`, which the others check before each of their micro-batches (one store
    round trip, no waiting for each other); `reduce` is the step's one meeting point."""

    def __init__(self, groups: RankGroups, batch_samples: int, key: str) -> None:
        self.groups = groups
        self._batch_samples = batch_samples
        self.key = key

    @property
    def batch_samples(self) -> int:
        return self._batch_samples

    def should_stop(self, local: bool) -> bool:
        if local:
            self.groups.store.set(self.key, "1")
            return True
        return bool(self.groups.store.check([self.key]))

    def reduce(
        self,
        params: Sequence[torch.nn.Parameter],
        loss_sum: float,
        counted: int,
        stopped: bool,
    ) -> tuple[float, int] | None:
        sums = torch.tensor(
            [loss_sum, float(counted), 1.0 if stopped else 0.0], dtype=torch.float64
        )
        dist.all_reduce(sums, group=self.groups.control)
        if sums[2] > 0:
            return None
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        for bucket in _buckets(grads):
            flat = torch.cat([grad.detach().reshape(-1).float() for grad in bucket])
            dist.all_reduce(flat, group=self.groups.data)
            offset = 0
            for grad in bucket:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        return float(sums[0]), round(float(sums[1]))


def _buckets(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive groups of at most `BUCKET_ELEMENTS` elements (a larger tensor alone)."""
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        if buckets[-1] and size + tensor.numel() > BUCKET_ELEMENTS:
            buckets.append([])
            size = 0
        buckets[-1].append(tensor)
        size += tensor.numel()
    return [bucket for bucket in buckets if bucket]


def agree(groups: RankGroups, value: bytes, what: str) -> list[bytes]:
    """Every rank's `value` (all ranks get the list); raises `RankMismatch` on every rank
    when one differs from rank 0's."""
    values: list[Any] = [None] * groups.world_size
    dist.all_gather_object(values, value, group=groups.control)
    bad = first_mismatch(values)
    if bad is not None:
        raise RankMismatch(
            f"rank {bad}'s {what} ({bytes(values[bad]).hex()[:16]}…) differs from rank 0's "
            f"({bytes(values[0]).hex()[:16]}…)"
        )
    return values


def any_rank(groups: RankGroups, local: bool) -> bool:
    """True on every rank when `local` is true on any rank."""
    flag = torch.tensor([1 if local else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=groups.control)
    return bool(flag.item())


def sum_floats(groups: RankGroups, values: Sequence[float]) -> list[float]:
    """Element-wise sum over the ranks (float64, on the control group)."""
    tensor = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(tensor, group=groups.control)
    return [float(v) for v in tensor]


def ping(groups: RankGroups) -> None:
    """A collective every rank must join: proves that every rank still answers."""
    dist.all_reduce(torch.zeros(1), group=groups.control)


def broadcast_object(groups: RankGroups, value: Any) -> Any:
    """Rank 0's `value` on every rank (pickled, over the control group)."""
    box = [value if groups.is_rank0 else None]
    dist.broadcast_object_list(box, src=0, group=groups.control)
    return box[0]


def scatter_object(groups: RankGroups, values: Sequence[Any] | None) -> Any:
    """Rank 0's `values[r]` on rank r (pickled, over the control group)."""
    out: list[Any] = [None]
    dist.scatter_object_list(
        out, list(values) if groups.is_rank0 and values else None, src=0, group=groups.control
    )
    return out[0]


def gather_object(groups: RankGroups, value: Any) -> list[Any] | None:
    """Every rank's `value` on rank 0 (None elsewhere)."""
    out: list[Any] | None = [None] * groups.world_size if groups.is_rank0 else None
    dist.gather_object(value, out, dst=0, group=groups.control)
    return out


def _padded(rows: torch.Tensor, size: int) -> torch.Tensor:
    if rows.shape[0] == size:
        return rows.contiguous()
    padded = torch.zeros((size, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    padded[: rows.shape[0]] = rows
    return padded


def scatter_rows(
    groups: RankGroups,
    full: torch.Tensor | None,
    local: torch.Tensor,
    src: int,
    rows: Sequence[tuple[int, int]],
) -> None:
    """Copy `full` (given on rank `src`) into every rank's shard `local` (rows `rows[rank]`)."""
    size = max(end - start for start, end in rows)
    if size == 0:
        return
    received = torch.empty((size, *local.shape[1:]), dtype=local.dtype, device=local.device)
    pieces = None
    if groups.rank == src:
        assert full is not None
        pieces = [_padded(full[start:end].to(local.dtype), size) for start, end in rows]
    dist.scatter(received, pieces, src=src, group=groups.data)
    with torch.no_grad():
        local.copy_(received[: local.shape[0]])


def gather_rows(
    groups: RankGroups,
    local: torch.Tensor,
    dst: int,
    rows: Sequence[tuple[int, int]],
) -> torch.Tensor | None:
    """Every rank's shard `local` (rows `rows[rank]`) joined into the full tensor on `dst`."""
    size = max(end - start for start, end in rows)
    sent = _padded(local.detach(), size)
    parts = [torch.empty_like(sent) for _ in rows] if groups.rank == dst else None
    dist.gather(sent, parts, dst=dst, group=groups.data)
    if parts is None:
        return None
    return torch.cat([part[: end - start] for part, (start, end) in zip(parts, rows, strict=True)])


def send_tensor(
    groups: RankGroups,
    tensor: torch.Tensor | None,
    src: int,
    dst: int,
    buffer: torch.Tensor | None,
) -> torch.Tensor | None:
    """Move `tensor` (given on rank `src`) to rank `dst`, which receives into `buffer` (its
    shape, dtype and device) and gets it back; other ranks get None. No copy when
    `src == dst`."""
    if src == dst:
        return tensor if groups.rank == dst else None
    if groups.rank == src:
        assert tensor is not None
        dist.send(tensor.detach().contiguous(), dst=dst, group=groups.data)
        return None
    if groups.rank == dst:
        assert buffer is not None
        dist.recv(buffer, src=src, group=groups.data)
        return buffer
    return None


def broadcast_bytes(groups: RankGroups, data: bytes | None, size: int) -> bytes:
    """Rank 0's `data` (`size` bytes) on every rank, as a uint8 tensor over the control group."""
    if groups.is_rank0:
        assert data is not None and len(data) == size
        buffer = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if size
            else torch.empty(0, dtype=torch.uint8)
        )
    else:
        buffer = torch.empty(size, dtype=torch.uint8)
    if size:
        dist.broadcast(buffer, src=0, group=groups.control)
    return data if groups.is_rank0 and data is not None else bytes(buffer.numpy())


def all_gather(groups: RankGroups, value: Any) -> list[Any]:
    """Every rank's `value`, on every rank (pickled, over the control group)."""
    values: list[Any] = [None] * groups.world_size
    dist.all_gather_object(values, value, group=groups.control)
    return values
