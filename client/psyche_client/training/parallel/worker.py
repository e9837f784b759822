"""A worker rank of a multi-device client: join the world, then execute rank 0's commands
until `Shutdown`.

Started by rank 0 (`python -m psyche_client.training.parallel.worker`, configured through the
environment, see `launch`) or by `torchrun` (`psyche-client train` on a rank other than 0 calls
`serve`). A worker never talks to the coordinator or to peers. It exits with status 0 after
`Shutdown`, 1 when a command fails or rank 0 is gone (its message on stderr names the rank),
and it exits by itself when the rank 0 that started it dies.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

from psyche_client.training.model.device import DeviceError
from psyche_client.training.parallel.commands import CommandChannel, Shutdown
from psyche_client.training.parallel.engines import Engine, execute
from psyche_client.training.parallel.launch import (
    ENV_DEVICE,
    ENV_PARENT,
    ENV_TIMEOUT,
    RankZeroGone,
    connect,
    disconnect,
    rank_device,
    watch_parent,
)
from psyche_client.training.parallel.plan import LaunchEnv, ParallelLaunchError
from psyche_client.training.parallel.supervisor import LIVENESS_INTERVAL

log = logging.getLogger("psyche.client.worker")


def serve(env: LaunchEnv, device_spec: str, timeout: float) -> int:
    """Join as `env.rank` and execute commands until `Shutdown`; returns the exit status."""
    try:
        device = rank_device(device_spec, env.local_rank, env.world_size)
        groups = connect(env, device, timeout)
    except RankZeroGone as exc:
        _say(env.rank, f"{exc}: nothing to do")
        return 0
    except (DeviceError, ParallelLaunchError, RuntimeError, ValueError) as exc:
        _say(env.rank, f"cannot join the client's ranks: {exc}")
        return 1
    channel = CommandChannel(groups)
    channel.start_liveness(LIVENESS_INTERVAL)
    engine: Engine | None = None
    try:
        while True:
            sequence, command = channel.receive()
            if isinstance(command, Shutdown):
                return 0
            engine = execute(engine, groups, command)
            channel.finished(sequence, command)
    except Exception as exc:
        _say(env.rank, f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        disconnect()


def _say(rank: int, message: str) -> None:
    print(f"psyche-client rank {rank} (pid {os.getpid()}): {message}", file=sys.stderr, flush=True)


def main() -> int:
    """Entry point of a worker that rank 0 started itself."""
    env = LaunchEnv.from_env(os.environ)
    if env is None or ENV_DEVICE not in os.environ:
        print("this module is started by psyche-client train --data-parallelism N", file=sys.stderr)
        return 2
    parent = os.environ.get(ENV_PARENT)
    if parent:
        watch_parent(int(parent))
    logging.basicConfig(level=logging.WARNING, format=f"rank {env.rank}: %(message)s")
    return serve(env, os.environ[ENV_DEVICE], float(os.environ.get(ENV_TIMEOUT, "300")))


def exit_now(status: int) -> NoReturn:
    """Leave without interpreter finalisation: gloo's transport threads can still be
    tearing down after `destroy_process_group`, and finalising the interpreter under them
    aborts the process now and then ("terminate called without an active exception"),
    which would turn a clean shutdown into a crash report."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main())
