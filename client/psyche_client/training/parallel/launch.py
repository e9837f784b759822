"""Starting the ranks of a multi-device client and joining their process groups.

A client with N local ranks is rank 0 of a torch.distributed world of N processes: rank 0 is
the client process (server link, P2P, round pipeline), ranks 1..N-1 are workers that execute
its commands. Two ways to get there:

* self-started: rank 0 hosts a `TCPStore` on 127.0.0.1 (a free port picked by the OS) and
  starts the workers itself (`python -m psyche_client.training.parallel.worker`, with
  `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT` and the device and
  timeout in `PSYCHE_PARALLEL_*` variables); `WorkerProcesses` keeps their handles.
* under `torchrun`: every rank runs `psyche-client train`; `LaunchEnv.from_env` reads
  torchrun's variables, rank 0 becomes the client and the others call the worker loop. The
  store is torchrun's agent store when it provides one (`TORCHELASTIC_USE_AGENT_STORE`).

Workers wait for rank 0 without a deadline (rank 0 may load its model long after start-up
under torchrun): they block on a store key that rank 0 sets when it joins, and exit (status 0) when rank 0
instead marks that it exited without joining (`release_workers`, at its exit under torchrun);
rank 0 waits (up to `STARTUP_TIMEOUT`) until every worker has announced itself. After that every collective has the
client's `--parallel-timeout`. `connect` returns the `RankGroups`: the
data group (NCCL on CUDA, gloo on CPU) for gradients and parameter rows, and a gloo control
group for commands, flags and Python objects.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from psyche_client.training.model.device import DeviceError, resolve_device
from psyche_client.training.parallel.plan import LaunchEnv, ParallelLaunchError

ENV_DEVICE = "PSYCHE_PARALLEL_DEVICE"
ENV_TIMEOUT = "PSYCHE_PARALLEL_TIMEOUT"
ENV_PARENT = "PSYCHE_PARALLEL_PARENT"
STORE_PREFIX = "psyche-parallel"
GO_KEY = "rank0-joined"
DONE_KEY = "rank0-exited"
PATIENT_WAIT = timedelta(days=7)  # workers wait this long for rank 0 to join
STARTUP_TIMEOUT = 600.0  # rank 0 waits this long for its workers to start
WORKER_MODULE = "psyche_client.training.parallel.worker"


def rank_device(spec: str, local_rank: int, world_size: int) -> torch.device:
    """The device of local rank `local_rank` for the client's `--device` choice: CUDA ranks
    use GPU `local_rank`; a fixed `cuda:N` only makes sense for a single rank."""
    text = spec.strip().lower()
    if world_size > 1 and text.startswith("cuda:"):
        raise DeviceError(
            f"--device {spec} names one GPU but the client has {world_size} ranks: "
            "use --device cuda (rank r uses GPU r)"
        )
    device = resolve_device(spec)
    if device.type == "mps":
        raise DeviceError("MPS has no torch.distributed backend: use --device cpu or cuda")
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if world_size > count:
            raise DeviceError(f"{world_size} CUDA ranks need {world_size} GPUs, {count} visible")
        return torch.device("cuda", local_rank)
    return device


def data_backend(device: torch.device) -> str:
    """The torch.distributed backend of the ranks' data group on `device`: NCCL for CUDA
    tensors, gloo for CPU ones (the control group is gloo on every device)."""
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass
class RankGroups:
    """One rank's view of the client's world."""

    rank: int
    world_size: int
    device: torch.device
    data: Any  # ProcessGroup: NCCL on CUDA, gloo on CPU
    control: Any  # ProcessGroup: gloo, CPU tensors and pickled objects
    store: Any  # the PrefixStore the ranks share (progress reports)
    timeout: float

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def connect(
    env: LaunchEnv,
    device: torch.device,
    timeout: float,
    store: Any | None = None,
    abort: Callable[[], str | None] = lambda: None,
    startup_timeout: float = STARTUP_TIMEOUT,
) -> RankGroups:
    """Join the client's world as `env.rank` (rank 0 may pass the store it hosts). Rank 0
    first waits up to `startup_timeout` s for every worker to arrive (starting a Python
    process with torch takes a while), giving up early when `abort()` names a reason."""
    if store is None:
        is_server = env.rank == 0 and not env.agent_store
        store = dist.TCPStore(
            env.master_addr,
            env.master_port,
            is_master=is_server,
            timeout=PATIENT_WAIT,
            wait_for_workers=False,
        )
    shared = dist.PrefixStore(STORE_PREFIX, store)
    if env.rank == 0:
        shared.set(GO_KEY, "1")
        _wait_for_workers(shared, env.world_size, abort, startup_timeout)
    else:
        shared.set(f"arrived/{env.rank}", "1")
        _wait_for_rank0(shared)
    backend = data_backend(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    deadline = timedelta(seconds=timeout)
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("world", shared),
        rank=env.rank,
        world_size=env.world_size,
        timeout=deadline,
    )
    data = dist.group.WORLD
    control = data if backend == "gloo" else dist.new_group(backend="gloo", timeout=deadline)
    return RankGroups(env.rank, env.world_size, device, data, control, shared, timeout)


class RankZeroGone(ParallelLaunchError):
    """Rank 0 exited (under torchrun) without ever starting the ranks' world."""


def _wait_for_rank0(store: Any) -> None:
    while not store.check([GO_KEY]):
        if store.check([DONE_KEY]):
            raise RankZeroGone("rank 0 exited before it loaded the model")
        time.sleep(0.5)


def release_workers(env: LaunchEnv) -> None:
    """Rank 0 under torchrun is exiting: tell workers still waiting for it to join that it
    never will (they exit with status 0). Harmless when they are gone already."""
    with contextlib.suppress(Exception):
        store = dist.TCPStore(
            env.master_addr,
            env.master_port,
            is_master=not env.agent_store,
            timeout=timedelta(seconds=5),
            wait_for_workers=False,
        )
        dist.PrefixStore(STORE_PREFIX, store).set(DONE_KEY, "1")


def _wait_for_workers(
    store: Any, world_size: int, abort: Callable[[], str | None], limit: float
) -> None:
    keys = [f"arrived/{rank}" for rank in range(1, world_size)]
    deadline = time.monotonic() + limit
    while not store.check(keys):
        reason = abort()
        if reason:
            raise ParallelLaunchError(f"the worker ranks did not start: {reason}")
        if time.monotonic() > deadline:
            missing = [key.split("/")[1] for key in keys if not store.check([key])]
            raise ParallelLaunchError(
                f"rank(s) {', '.join(missing)} did not join within {limit:.0f} s"
            )
        time.sleep(0.2)


def disconnect() -> None:
    """Leave the world (no-op when this process never joined one)."""
    if dist.is_initialized():
        dist.destroy_process_group()


class WorkerProcesses:
    """The worker ranks rank 0 started itself: their handles, liveness and shutdown."""

    def __init__(self, processes: dict[int, subprocess.Popen[bytes]]) -> None:
        self.processes = processes

    @classmethod
    def start(cls, world_size: int, port: int, device_spec: str, timeout: float) -> WorkerProcesses:
        """Start ranks 1..world_size-1 on this machine (their output goes to ours)."""
        started: dict[int, subprocess.Popen[bytes]] = {}
        base = dict(os.environ)
        for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "GROUP_RANK"):
            base.pop(name, None)
        for rank in range(1, world_size):
            env = dict(
                base,
                RANK=str(rank),
                WORLD_SIZE=str(world_size),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(world_size),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            env[ENV_DEVICE] = device_spec
            env[ENV_TIMEOUT] = str(timeout)
            env[ENV_PARENT] = str(os.getpid())
            try:
                started[rank] = subprocess.Popen(
                    [sys.executable, "-m", WORKER_MODULE], env=env, start_new_session=True
                )
            except OSError as exc:
                cls(started).stop()
                raise ParallelLaunchError(f"could not start rank {rank}: {exc}") from exc
        return cls(started)

    def exited(self) -> list[tuple[int, int, int]]:
        """`(rank, pid, returncode)` of every worker that is no longer running."""
        return [
            (rank, proc.pid, code)
            for rank, proc in sorted(self.processes.items())
            if (code := proc.poll()) is not None
        ]

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every live worker, then SIGKILL what is still alive after `grace` s."""
        for proc in self.processes.values():
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
                _signal_group(proc, signal.SIGCONT)  # a stopped process handles SIGTERM too
        deadline = time.monotonic() + grace
        for proc in self.processes.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s for every worker to exit; True when all did."""
        deadline = time.monotonic() + timeout
        for proc in self.processes.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True


def describe_exit(rank: int, pid: int, code: int) -> str:
    """`rank 1 (pid 42) was killed by SIGKILL` / `... exited with status 1`."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} (pid {pid}) was killed by {name}"
    return f"rank {rank} (pid {pid}) exited with status {code}"


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the worker's process group (it leads its own session), else the worker."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def watch_parent(parent_pid: int, interval: float = 1.0) -> None:
    """Exit this worker (status 1) as soon as its parent rank 0 is gone (a daemon thread)."""
    import threading

    def loop() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent_pid:
                print(
                    f"psyche-client worker (pid {os.getpid()}): rank 0 (pid {parent_pid}) "
                    "is gone; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)

    threading.Thread(target=loop, name="parent-watch", daemon=True).start()
