"""What every rank of a multi-device client executes: the engine interface, the choice of
engine for a `LoadModel` command, and a worker's dispatch of one command.

An engine's methods are called on every rank in the same order (rank 0 with the real inputs,
workers with None), and each one's collectives meet the other ranks' calls. `ReplicatedEngine`
holds a full replica per rank; `ShardedEngine` a `fully_shard` model.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch

from psyche_client.distro import DistroResult, ResultLayout
from psyche_client.training.model.loading import ModelInfo
from psyche_client.training.parallel.commands import (
    Apply,
    Cancel,
    Command,
    ExportParameters,
    GatherState,
    Heartbeat,
    LoadModel,
    LoadParameters,
    Train,
)
from psyche_client.training.parallel.launch import RankGroups
from psyche_client.training.trainer import TrainingCancelled, TrainOutput


class Engine(Protocol):
    info: ModelInfo
    digest: bytes  # the weights hash (on rank 0), refreshed by load, apply and load_parameters
    holds_whole_model: bool  # rank 0 exports and checkpoints alone (no command)

    @property
    def layout(self) -> ResultLayout:
        """The layout of every result of the run (all parameters, sorted by name)."""
        ...

    def train(self, command: Train, cancelled: Callable[[], bool]) -> TrainOutput | None: ...

    def apply(self, command: Apply, results: Sequence[DistroResult] | None) -> None: ...

    def cancel(self) -> None: ...

    def load_parameters(self, parameters: Mapping[str, bytes] | None) -> None: ...

    def export_parameters(self) -> list[tuple[str, str, tuple[int, ...], bytes]] | None: ...

    def checkpoint_state(self) -> dict[str, torch.Tensor] | None:
        """Every parameter as a CPU tensor, on rank 0 (None elsewhere)."""
        ...


def build_engine(groups: RankGroups, command: LoadModel) -> Engine:
    """Load the model on this rank (every rank calls this for the same command)."""
    if groups.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // groups.world_size))
    if command.fsdp:
        from psyche_client.training.parallel.sharded import ShardedEngine

        return ShardedEngine.load(groups, command)
    from psyche_client.training.parallel.replicated import ReplicatedEngine

    return ReplicatedEngine.load(groups, command)


def never() -> bool:
    return False


def execute(engine: Engine | None, groups: RankGroups, command: Command) -> Engine | None:
    """A worker's share of `command`; returns the engine (new after `LoadModel`)."""
    if isinstance(command, LoadModel):
        return build_engine(groups, command)
    if isinstance(command, Heartbeat):
        return engine
    if engine is None:
        raise RuntimeError(f"{type(command).__name__} before the model was loaded")
    if isinstance(command, Train):
        with contextlib.suppress(TrainingCancelled):  # every rank was cancelled alike
            engine.train(command, never)
    elif isinstance(command, Apply):
        engine.apply(command, None)
    elif isinstance(command, Cancel):
        engine.cancel()
    elif isinstance(command, LoadParameters):
        engine.load_parameters(None)
    elif isinstance(command, ExportParameters):
        engine.export_parameters()
    elif isinstance(command, GatherState):
        engine.checkpoint_state()
    else:
        raise RuntimeError(f"unknown command {command!r}")
    return engine
