"""`ParallelBackend`: the `TrainingBackend` of a multi-device client, on rank 0.

The round pipeline sees one backend, as for a single device. Every method that changes or
needs every rank's model becomes a command that rank 0 broadcasts to its worker ranks and then
executes its own share of (`engines`); `decode`, `begin_round` and `weights_hash` stay on rank
0 (the hash is the one every engine refreshed after loading and after every apply, so asking
for it never waits), and so do exporting and checkpointing a replica (a sharded model is first
gathered on rank 0 by a command; the files are written outside it). Results are encoded by
rank 0 alone; their bytes are a single-device client's for the same gradient.

`ParallelBackend.load` starts the world: under `torchrun` (the launch variables are set) rank 0
joins the ranks torchrun started; otherwise it starts `data_parallelism - 1` worker
processes itself. The workers are shut down at exit (`close`, registered with `atexit`); a
dead, frozen or disagreeing rank ends the client (`supervisor`).
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch.distributed as dist
from psyche_common.batch_id import BatchId
from psyche_common.config import AnyLRSchedule
from psyche_common.coordinator import Coordinator
from psyche_common.lr_schedule import effective_lr

from psyche_client.distro.result import DistroResult
from psyche_client.distro.size import encoded_result_size
from psyche_client.training.backend import (
    Capabilities,
    DecodedResult,
    Samples,
    TrainedResult,
    WarmupBounds,
    WeightsSnapshot,
)
from psyche_client.training.distro_backend import checkpoint_source, decode_checked
from psyche_client.training.model.checkpoint import save_state_checkpoint
from psyche_client.training.model.device import resolve_device
from psyche_client.training.model.loading import ModelInfo, config_from_dict
from psyche_client.training.model.precision import Precision
from psyche_client.training.optimizers.distro import DISTRO
from psyche_client.training.parallel.commands import (
    Apply,
    Cancel,
    CommandChannel,
    ExportParameters,
    GatherState,
    LoadModel,
    LoadParameters,
    Shutdown,
    Train,
)
from psyche_client.training.parallel.engines import Engine, build_engine
from psyche_client.training.parallel.launch import (
    RankGroups,
    WorkerProcesses,
    connect,
    disconnect,
    rank_device,
)
from psyche_client.training.parallel.plan import (
    LaunchEnv,
    ParallelLaunchError,
    ParallelSpec,
    ranks_precision,
)
from psyche_client.training.parallel.supervisor import Supervisor
from psyche_client.training.trainer import TrainingCancelled

DEFAULT_TIMEOUT = 300.0
SHUTDOWN_WAIT = 10.0


class ParallelBackend:
    def __init__(
        self,
        groups: RankGroups,
        channel: CommandChannel,
        supervisor: Supervisor,
        engine: Engine,
        lr_schedule: AnyLRSchedule,
        warmup_bounds: WarmupBounds | None,
    ) -> None:
        self.groups = groups
        self.channel = channel
        self.supervisor = supervisor
        self.engine = engine
        self.lr_schedule = lr_schedule
        self.warmup_bounds = warmup_bounds
        self._closed = False
        self.capabilities = Capabilities(model_info=engine.info)
        """The model spans several processes: no live model for evals, no verifier, no
        optimizer statistics."""

    @classmethod
    def load(
        cls,
        coordinator: Coordinator,
        *,
        spec: ParallelSpec,
        device: str,
        micro_batch_size: int,
        timeout: float = DEFAULT_TIMEOUT,
        from_peers: bool = False,
        peer_config: dict[str, Any] | None = None,
        precision: Precision | None = None,
    ) -> ParallelBackend:
        """Start the ranks and load the run's model on every one of them (see module doc).
        ``from_peers`` changes nothing here: the peers' weights come with `load_parameters`."""
        del from_peers
        llm = coordinator.model
        if not DISTRO.matches(llm.optimizer):
            raise ValueError(
                "a multi-device client trains with DisTrO only: the run's optimizer is not Distro"
            )
        settings = DISTRO.settings_for(llm.optimizer)
        source = checkpoint_source(llm.checkpoint)
        if source is None and peer_config is None:
            raise ValueError(f"checkpoint {llm.checkpoint!r} names no model repository")
        command = LoadModel(
            source=source.repo_id if source else None,
            revision=source.revision if source else None,
            peer_config=peer_config,
            optimizer=settings,
            micro_batch_size=micro_batch_size,
            fsdp=spec.fsdp,
            architecture=llm.architecture,
            precision=ranks_precision(precision or Precision(), spec, resolve_device(device).type),
        )
        groups, channel, supervisor = _start_world(spec, device, timeout)
        try:
            with supervisor.command(command, "loading the model"):
                engine = build_engine(groups, command)
        except BaseException:
            supervisor.stop()
            _stop_world(supervisor, failed=True)
            raise
        backend = cls(
            groups,
            channel,
            supervisor,
            engine,
            llm.lr_schedule,
            coordinator.get_cold_start_warmup_bounds(),
        )
        atexit.register(backend.close)
        return backend

    # ---- TrainingBackend ---------------------------------------------------------------------
    @property
    def info(self) -> ModelInfo:
        return self.engine.info

    def begin_round(self, warmup_bounds: WarmupBounds | None) -> None:
        self.warmup_bounds = warmup_bounds

    def lr(self, step: int) -> float:
        return effective_lr(self.lr_schedule, step, self.warmup_bounds)

    def train(
        self, step: int, batch: BatchId, samples: Samples | None, cancelled: Callable[[], bool]
    ) -> TrainedResult | None:
        if samples is None:
            raise ValueError(f"step {step} {batch}: a multi-device client trains on samples")
        tokens = np.asarray(samples, dtype=np.int64)
        command = Train(step, batch, self.lr(step), self.lr(step - 1), tokens)
        try:
            with self.supervisor.command(command, f"training step {step} {batch}"):
                output = self.engine.train(command, cancelled)
        except TrainingCancelled:
            return None
        assert output is not None and output.result is not None
        return TrainedResult(
            loss=output.loss,
            payload=output.result.encode(),
            data_hash=output.result.data_hash(),
            tokens=int(tokens.size),
        )

    def decode(self, step: int, batch: BatchId, payload: bytes, data_hash: bytes) -> DistroResult:
        return decode_checked(payload, self.engine.layout, step, batch, data_hash)

    def result_size(self) -> int:
        return encoded_result_size(self.engine.layout)

    def apply(self, step: int, results: Sequence[DecodedResult]) -> None:
        distro_results = [r for r in results if isinstance(r, DistroResult)]
        if len(distro_results) != len(results):
            raise TypeError("ParallelBackend applies only DistroResults")
        command = Apply(step, self.lr(step))
        with self.supervisor.command(command, f"applying step {step}"):
            self.engine.apply(command, distro_results)

    def snapshot(self) -> WeightsSnapshot:
        """Every parameter's bytes (gathered on rank 0) and the weights hash they have."""
        entries = self.export_parameters()
        return ({name: data for name, _, _, data in entries}, self.weights_hash())

    def restore(self, snapshot: WeightsSnapshot) -> None:
        """Put a snapshot back on every rank (through `load_parameters`, which also restarts
        the momentum: only an early apply that turned out wrong is undone this way)."""
        assert isinstance(snapshot, tuple)
        parameters, digest = snapshot
        self.load_parameters(parameters)
        if self.weights_hash() != digest:
            raise RuntimeError("restoring the weights snapshot did not give back its hash")

    def cancel_round(self) -> None:
        with self.supervisor.command(Cancel(), "dropping an unpublished result"):
            self.engine.cancel()

    def weights_hash(self) -> bytes:
        return self.engine.digest

    def export_parameters(self) -> list[tuple[str, str, tuple[int, ...], bytes]]:
        if self.engine.holds_whole_model:
            entries = self.engine.export_parameters()
        else:
            with self.supervisor.command(ExportParameters(), "exporting the parameters"):
                entries = self.engine.export_parameters()
        assert entries is not None
        return entries

    def load_parameters(self, parameters: dict[str, bytes]) -> None:
        expected = {tensor.name for tensor in self.engine.layout.tensors}
        if set(parameters) != expected:
            missing = sorted(expected - set(parameters))[:3]
            extra = sorted(set(parameters) - expected)[:3]
            raise ValueError(f"peer model does not match: missing {missing}, unexpected {extra}")
        with self.supervisor.command(LoadParameters(), "loading peer parameters"):
            self.engine.load_parameters(parameters)

    def save_checkpoint(self, directory: str) -> None:
        """Gather the parameters on rank 0, then write the files there while the workers wait
        idle (heartbeats keep their waits short however long the writing takes)."""
        if self.engine.holds_whole_model:
            state = self.engine.checkpoint_state()
        else:
            with self.supervisor.command(GatherState(), "gathering the model for a checkpoint"):
                state = self.engine.checkpoint_state()
        assert state is not None
        config = config_from_dict(self.info.config)
        save_state_checkpoint(state, config, directory, self.info.extra_files)

    # ---- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        """Shut the workers down and leave the world (idempotent; also run at exit)."""
        if self._closed:
            return
        self._closed = True
        self.supervisor.stop()
        _stop_world(self.supervisor, failed=self.supervisor.failure is not None)


def _start_world(
    spec: ParallelSpec, device_spec: str, timeout: float
) -> tuple[RankGroups, CommandChannel, Supervisor]:
    """Rank 0's start: join torchrun's ranks, or start the workers and join them. On failure
    nothing is left running."""
    env = LaunchEnv.from_env(os.environ)
    torchrun = env is not None and env.world_size > 1
    if torchrun:
        assert env is not None
        if env.world_size != spec.world_size:
            raise ParallelLaunchError(
                f"torchrun started {env.world_size} ranks but the client was asked for "
                f"{spec.world_size} (--data-parallelism)"
            )
        if env.rank != 0:
            raise ParallelLaunchError(f"rank {env.rank} is a worker: only rank 0 loads a backend")
        device = rank_device(device_spec, env.local_rank, env.world_size)
        store = None
        supervisor = Supervisor(None, timeout)
    else:
        device = rank_device(device_spec, 0, spec.world_size)
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        env = LaunchEnv(0, spec.world_size, 0, "127.0.0.1", store.port)
        workers = WorkerProcesses.start(spec.world_size, store.port, device_spec, timeout)
        supervisor = Supervisor(workers, timeout)
    supervisor.start()
    try:
        with supervisor.command(None, "joining the worker ranks"):
            groups = connect(env, device, timeout, store=store, abort=lambda: supervisor.failure)
    except BaseException:
        supervisor.stop()
        _stop_world(supervisor, failed=True)
        raise
    channel = CommandChannel(groups)
    supervisor.attach(channel)
    return groups, channel, supervisor


def _stop_world(supervisor: Supervisor, failed: bool) -> None:
    channel = supervisor.channel
    if not failed and channel is not None:
        try:
            channel.send(Shutdown())
        except Exception:
            failed = True
    workers = supervisor.workers
    if workers is not None and (failed or not workers.wait(SHUTDOWN_WAIT)):
        workers.stop()
    disconnect()
