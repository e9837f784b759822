"""A model sharded over a client's ranks with `fully_shard` (FSDP2), plus the full copies of
the parameters each rank owns for DisTrO.

Layout on every rank:
* the FSDP2 module: each parameter's dimension-0 rows `plan.shard_rows(rows, ranks)[rank]`;
  every decoder layer and the input and output embeddings are units of their own (tied
  embeddings one unit together; `units.fsdp_units`), so forward/backward all-gather one unit
  at a time (plus the prefetched next) and gradients are reduce-scattered;
* `masters`: the full copy (parameter dtype) of each parameter this rank owns (`plan.assign_owners`,
  whole parameters balanced by size). The owner's copy is the source of truth: DisTrO's
  lookahead, `generate` and `apply` run on it, and every change is scattered back into the
  shards (`push`). Whole parameters, because a DisTrO tile must be whole for its DCT and
  top-k, and dimension-0 shards cut tiles.

Loading is staggered: rank r builds the full model in host memory only after rank r-1 has
sharded its copy, so the host holds one full model at a time; a device holds only its shards,
its masters and one unsharded layer. `consistency_digests` and `verify` check that every
rank's shard equals its rows of the owner's copy; `stream_to_rank0` brings parameters to rank
0 one at a time (weights hash, export, checkpoint) so no rank ever holds the whole model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from psyche_client.training.distro_backend import RNG_SEED, load_run_model
from psyche_client.training.model.loading import ModelInfo
from psyche_client.training.model.numerics import enable_tf32
from psyche_client.training.model.params import raw_bytes
from psyche_client.training.parallel.collectives import (
    RankMismatch,
    all_gather,
    broadcast_bytes,
    scatter_rows,
    send_tensor,
)
from psyche_client.training.parallel.commands import LoadModel
from psyche_client.training.parallel.launch import RankGroups
from psyche_client.training.parallel.plan import assign_owners, shard_rows
from psyche_client.training.parallel.units import fsdp_units


@dataclass
class ShardedModel:
    groups: RankGroups
    module: torch.nn.Module  # the FSDP2-wrapped model (DTensor parameters)
    info: ModelInfo
    names: list[str]  # every parameter, ascending
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    rows: dict[str, list[tuple[int, int]]]
    owners: dict[str, int]
    masters: dict[str, torch.nn.Parameter]  # the parameters this rank owns, full size

    @property
    def params(self) -> list[tuple[str, Any]]:
        named = dict(self.module.named_parameters())
        return [(name, named[name]) for name in self.names]

    def local(self, param: Any) -> torch.Tensor:
        """This rank's rows of an FSDP2 parameter (a view: writes reach the shard)."""
        return param.to_local()

    def push(self, name: str, param: Any, full: torch.Tensor | None) -> None:
        """Scatter `full` (given on the owner of `name`) into every rank's shard."""
        scatter_rows(self.groups, full, self.local(param), self.owners[name], self.rows[name])

    def push_masters(self) -> None:
        for name, param in self.params:
            self.push(name, param, self.masters.get(name))

    def stream_to_rank0(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every parameter's full value, in name order, on rank 0 (one at a time); the other
        ranks must iterate too (they send their owned parameters)."""
        for name in self.names:
            like = (
                torch.empty(self.shapes[name], dtype=self.dtypes[name], device=self.groups.device)
                if self.groups.is_rank0 and self.owners[name] != 0
                else None
            )
            value = send_tensor(self.groups, self.masters.get(name), self.owners[name], 0, like)
            if self.groups.is_rank0:
                assert value is not None
                yield name, value

    def load_bytes(self, parameters: Mapping[str, bytes] | None) -> None:
        """Overwrite every parameter from rank 0's raw bytes (owner copies and shards)."""
        for name, param in self.params:
            shape, dtype = self.shapes[name], self.dtypes[name]
            size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            data = broadcast_bytes(
                self.groups, parameters[name] if parameters is not None else None, size
            )
            full = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
                if size
                else torch.empty(shape, dtype=dtype)
            )
            with torch.no_grad():
                if name in self.masters:
                    self.masters[name].copy_(full.to(self.groups.device))
                start, end = self.rows[name][self.groups.rank]
                self.local(param).copy_(full[start:end].to(self.groups.device))

    def verify(self, what: str) -> None:
        """Raise `RankMismatch` (on every rank) when a shard differs from its owner's rows."""
        local = [hashlib.sha256(raw_bytes(self.local(param))).digest() for _, param in self.params]
        everyone = all_gather(self.groups, local)
        problems = []
        for i, name in enumerate(self.names):
            master = self.masters.get(name)
            if master is None:
                continue
            for rank, (start, end) in enumerate(self.rows[name]):
                if hashlib.sha256(raw_bytes(master[start:end])).digest() != everyone[rank][i]:
                    problems.append(f"rank {rank}'s shard of {name}")
        found = [p for ps in all_gather(self.groups, problems) for p in ps]
        if found:
            listed = ", ".join(found[:3]) + (
                f" and {len(found) - 3} more" if len(found) > 3 else ""
            )
            raise RankMismatch(f"{what}: {listed} differs from the parameter owner's copy")


def load_sharded(groups: RankGroups, command: LoadModel) -> ShardedModel:
    """Build the run's model on every rank in turn (host memory), keep the owned parameters'
    full copies on the device and shard the rest with `fully_shard`."""
    mesh = init_device_mesh(groups.device.type, (groups.world_size,))
    store = groups.store
    turn_wait = timedelta(seconds=groups.timeout)
    built: ShardedModel | None = None
    for turn in range(groups.world_size):
        if turn == groups.rank:
            if turn > 0:
                store.wait([f"sharded-load/{turn - 1}"], turn_wait * turn)
            built = _build(groups, command, mesh)
            store.set(f"sharded-load/{turn}", "1")
    store.wait([f"sharded-load/{groups.world_size - 1}"], turn_wait * groups.world_size)
    assert built is not None
    return built


def _build(groups: RankGroups, command: LoadModel, mesh: Any) -> ShardedModel:
    torch.manual_seed(RNG_SEED)
    # built on the host in the ranks' dtype (`ranks_precision` resolved it for their device)
    model, info = load_run_model(
        command.source,
        command.revision,
        command.peer_config,
        torch.device("cpu"),
        command.architecture,
        command.precision,
    )
    enable_tf32(groups.device)
    named = sorted(model.named_parameters(), key=lambda item: item[0])
    names = [name for name, _ in named]
    shapes = {name: tuple(int(d) for d in p.shape) for name, p in named}
    for name, shape in shapes.items():
        if not shape:
            raise ValueError(f"parameter {name} is a scalar: the sharded mode needs tensors")
    sizes = {name: p.numel() for name, p in named}
    owners = assign_owners(sizes, groups.world_size)
    masters = {
        name: torch.nn.Parameter(p.detach().to(groups.device, copy=True), requires_grad=False)
        for name, p in named
        if owners[name] == groups.rank
    }
    dtypes = {name: p.dtype for name, p in named}
    del named
    for unit in fsdp_units(model):
        fully_shard(unit[0] if len(unit) == 1 else unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # gradients are sums over the ranks, never means
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    model.train()
    rows = {name: shard_rows(shapes[name][0], groups.world_size) for name in names}
    return ShardedModel(groups, model, info, names, shapes, dtypes, rows, owners, masters)
