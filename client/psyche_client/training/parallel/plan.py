"""Pure planning for multi-device clients (no torch, no I/O).

What a client with several local ranks decides before any collective runs: the parallel layout
(`ParallelSpec`), how a batch's samples are split over the data-parallel ranks
(`split_samples`), how many micro-batch slots every rank steps through so that collectives
stay in lockstep (`micro_batch_slots`), the rows of a parameter that each rank holds in the
sharded mode (`shard_rows`, the layout `fully_shard` uses), which rank owns each parameter's
DisTrO state there (`assign_owners`), and which rank disagrees when digests are compared
(`first_mismatch`), where a rank stands in torchrun's world (`LaunchEnv`), and the numeric
settings every rank loads with (`ranks_precision`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from psyche_client.training.model.precision import Precision


@dataclass(frozen=True)
class ParallelSpec:
    """How one client spreads over local ranks.

    `data_parallelism` ranks each train a share of every batch. With `fsdp` the parameters,
    gradients and DisTrO state are also sharded over those ranks (a model that does not fit
    one device); without it every rank holds a full replica.
    """

    data_parallelism: int = 1
    fsdp: bool = False

    def __post_init__(self) -> None:
        if self.data_parallelism < 1:
            raise ValueError(f"data_parallelism must be >= 1, got {self.data_parallelism}")
        if self.fsdp and self.data_parallelism < 2:
            raise ValueError(
                "fsdp shards the model over the data-parallel ranks: it needs data_parallelism >= 2"
            )

    @property
    def world_size(self) -> int:
        return self.data_parallelism

    @property
    def enabled(self) -> bool:
        return self.data_parallelism > 1

    @property
    def mode(self) -> str:
        if not self.enabled:
            return "single"
        return "sharded" if self.fsdp else "replicated"


class ParallelLaunchError(RuntimeError):
    """The ranks of a multi-device client could not be started or configured."""


@dataclass(frozen=True)
class LaunchEnv:
    """Where a rank stands in its world, from torchrun's (or our own) environment variables."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    agent_store: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LaunchEnv | None:
        """The launch variables, or None when `RANK`/`WORLD_SIZE` are not both set."""
        if "RANK" not in env or "WORLD_SIZE" not in env:
            return None
        try:
            rank = int(env["RANK"])
            world_size = int(env["WORLD_SIZE"])
            local_rank = int(env.get("LOCAL_RANK", rank))
            port = int(env.get("MASTER_PORT", "29500"))
        except ValueError as exc:
            raise ParallelLaunchError(f"malformed torch.distributed variable: {exc}") from exc
        if not 0 <= rank < world_size:
            raise ParallelLaunchError(f"RANK {rank} is outside WORLD_SIZE {world_size}")
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=port,
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        )


def split_samples(count: int, ranks: int) -> list[range]:
    """Contiguous shares of `count` samples for `ranks` ranks: `count // ranks` each, the
    remainder one more each for the first ranks (a rank may get none)."""
    if count < 0 or ranks < 1:
        raise ValueError(f"cannot split {count} samples over {ranks} ranks")
    base, extra = divmod(count, ranks)
    shares = []
    start = 0
    for rank in range(ranks):
        size = base + (1 if rank < extra else 0)
        shares.append(range(start, start + size))
        start += size
    return shares


def micro_batch_slots(count: int, ranks: int, micro_batch_size: int) -> int:
    """Micro-batch slots every rank steps through: the most micro-batches any share has."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return max(math.ceil(len(share) / micro_batch_size) for share in split_samples(count, ranks))


def shard_rows(rows: int, ranks: int) -> list[tuple[int, int]]:
    """`[start, end)` rows of a dimension-0 shard per rank: chunks of `ceil(rows / ranks)`
    rows, as `torch.chunk` and `fully_shard` cut them (trailing ranks may hold none)."""
    if rows < 0 or ranks < 1:
        raise ValueError(f"cannot shard {rows} rows over {ranks} ranks")
    size = math.ceil(rows / ranks) if rows else 0
    return [(min(rank * size, rows), min((rank + 1) * size, rows)) for rank in range(ranks)]


def assign_owners(sizes: Mapping[str, int], ranks: int) -> dict[str, int]:
    """The rank that owns each parameter's DisTrO state: largest parameters first (ties by
    name), each to the rank with the fewest elements so far (ties to the lowest rank)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    load = [0] * ranks
    owners: dict[str, int] = {}
    for name, size in sorted(sizes.items(), key=lambda item: (-item[1], item[0])):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owners[name] = rank
        load[rank] += size
    return owners


def owned_elements(owners: Mapping[str, int], sizes: Mapping[str, int], ranks: int) -> list[int]:
    """Elements of parameters owned by each rank."""
    totals = [0] * ranks
    for name, rank in owners.items():
        totals[rank] += sizes[name]
    return totals


def first_mismatch(values: Sequence[bytes]) -> int | None:
    """The first rank whose value differs from rank 0's, or None when all agree."""
    for rank, value in enumerate(values):
        if value != values[0]:
            return rank
    return None


def ranks_precision(precision: Precision, spec: ParallelSpec, device_type: str) -> Precision:
    """The `Precision` every rank loads with: `auto` resolved for `device_type` (a sharded
    model is built on the host before it moves to the ranks' devices). The replicated mode
    takes every setting; the sharded one (`--fsdp`) refuses `--grad-accum-in-fp32` (FSDP2
    reduce-scatters each micro-batch's gradient into the shards in the parameter dtype) and
    flash_attention_2 (the model is built on the host, where that kernel does not load)."""
    resolved = replace(precision, dtype=precision.resolved(device_type))
    if not spec.fsdp:
        return resolved
    problem = fsdp_precision_problem(precision.grad_accum_in_fp32, precision.attn_implementation)
    if problem is not None:
        raise ValueError(problem)
    return resolved


def fsdp_precision_problem(grad_accum_in_fp32: bool, attn_implementation: str) -> str | None:
    """Why `--fsdp` cannot train with these precision flags (None: it can); the client checks
    it at start, before it joins a run."""
    if grad_accum_in_fp32:
        return (
            "--grad-accum-in-fp32 is not supported with --fsdp (FSDP2 reduce-scatters each "
            "micro-batch's gradient into the shards); drop one of the two"
        )
    if attn_implementation == "flash_attention_2":
        return "--attn-implementation flash_attention_2 is not supported with --fsdp; use sdpa"
    return None
