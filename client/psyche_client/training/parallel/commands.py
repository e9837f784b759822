"""The commands rank 0 sends to its worker ranks, and the channel that carries them.

Every rank executes the same sequence of commands (SPMD): rank 0 broadcasts a command over the
gloo control group, then rank 0 and every worker run the matching engine method, whose
collectives meet in the same order on every rank. Large data (result payloads, parameters)
travels inside the engine methods, not in the command. What rank 0 can do alone (decoding,
exporting a replica, writing files) is no command: the workers would only wait for it.

Workers report progress in the shared store (`progress/<rank>` = `<seq> <command> started` /
`finished`) and stamp `alive/<rank>` with the time every few seconds, so that when a collective
fails rank 0 can say which rank stopped where, and tell a frozen rank from a busy one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch.distributed as dist
from psyche_common.batch_id import BatchId
from psyche_common.config import Architecture

from psyche_client.distro import DistroSettings
from psyche_client.training.model.precision import Precision
from psyche_client.training.parallel.launch import RankGroups


@dataclass(frozen=True)
class LoadModel:
    """Build the model: from `source`@`revision` (local directory, `builtin:NAME`, Hub repo),
    or from a peer-shared `peer_config` whose weights arrive later with `LoadParameters`."""

    source: str | None
    revision: str | None
    peer_config: dict[str, Any] | None
    optimizer: DistroSettings
    micro_batch_size: int
    fsdp: bool
    architecture: Architecture
    precision: Precision = field(default_factory=Precision)


@dataclass(frozen=True)
class Train:
    """Train one batch: every rank takes its share of `tokens` (the whole batch)."""

    step: int
    batch: BatchId
    lr: float
    prev_lr: float
    tokens: np.ndarray


@dataclass(frozen=True)
class Apply:
    """Apply the results of a step (rank 0 distributes them inside the engine)."""

    step: int
    lr: float


@dataclass(frozen=True)
class Cancel:
    """The last trained result was not published: forget it (no error feedback from it)."""


@dataclass(frozen=True)
class LoadParameters:
    """Overwrite the weights with peer-fetched parameter bytes (rank 0 distributes them)."""


@dataclass(frozen=True)
class ExportParameters:
    """Bring every parameter's raw bytes to rank 0 (sharing with late joiners)."""


@dataclass(frozen=True)
class GatherState:
    """Bring every parameter to rank 0 as a CPU tensor (rank 0 then writes a checkpoint)."""


@dataclass(frozen=True)
class Heartbeat:
    """Nothing to do: keeps idle workers' waits short and proves every rank still answers."""


@dataclass(frozen=True)
class Shutdown:
    """The client is exiting: leave the world and exit."""


Command = (
    LoadModel
    | Train
    | Apply
    | Cancel
    | LoadParameters
    | ExportParameters
    | GatherState
    | Heartbeat
    | Shutdown
)


def command_name(command: Command) -> str:
    return type(command).__name__


class CommandChannel:
    """Broadcasts commands from rank 0 (`send`) to the workers (`receive`)."""

    def __init__(self, groups: RankGroups) -> None:
        self.groups = groups
        self.sequence = 0
        self.current = "nothing yet"

    def send(self, command: Command) -> int:
        """Rank 0: number the command and broadcast it."""
        self.sequence += 1
        self.current = f"command {self.sequence} ({command_name(command)})"
        dist.broadcast_object_list([self.sequence, command], src=0, group=self.groups.control)
        return self.sequence

    def receive(self) -> tuple[int, Command]:
        """A worker: wait for the next command and report that it started."""
        box: list[Any] = [None, None]
        dist.broadcast_object_list(box, src=0, group=self.groups.control)
        sequence, command = int(box[0]), box[1]
        self._report(f"{sequence} {command_name(command)} started")
        return sequence, command

    def finished(self, sequence: int, command: Command) -> None:
        """A worker: report that `command` is done."""
        self._report(f"{sequence} {command_name(command)} finished")

    def progress(self, rank: int) -> str:
        """Rank 0: what worker `rank` last reported (without blocking)."""
        key = f"progress/{rank}"
        try:
            if not self.groups.store.check([key]):
                return "nothing reported yet"
            return bytes(self.groups.store.get(key)).decode()
        except Exception as exc:  # the store lives in rank 0 or torchrun's agent
            return f"unknown ({exc})"

    def liveness(self, rank: int) -> float | None:
        """Rank 0: the unix time of worker `rank`'s last liveness stamp (None: none yet)."""
        key = f"alive/{rank}"
        try:
            if not self.groups.store.check([key]):
                return None
            return float(bytes(self.groups.store.get(key)).decode())
        except Exception:
            return None

    def start_liveness(self, interval: float) -> None:
        """A worker: stamp `alive/<rank>` every `interval` s from a daemon thread, so rank 0
        can tell a frozen rank from a busy one."""
        key = f"alive/{self.groups.rank}"
        store = self.groups.store

        def loop() -> None:
            while True:
                try:
                    store.set(key, repr(time.time()))
                except Exception:
                    return  # rank 0 (the store) is gone; the command loop will notice
                time.sleep(interval)

        threading.Thread(target=loop, name="liveness", daemon=True).start()

    def _report(self, text: str) -> None:
        self.groups.store.set(f"progress/{self.groups.rank}", text)
