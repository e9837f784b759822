"""Data parallelism over full replicas: every rank holds the whole model and the same DisTrO
state, and trains a share of each batch.

A batch's samples are split into contiguous shares (`plan.split_samples`, the remainder to the
first ranks); each rank cuts its share into micro-batches of `micro_batch_size` and weights
each micro-batch by its share of the *whole* batch's samples, so the gradient sum over the
ranks is the single-device gradient up to float reassociation. The ranks meet once per step,
after their micro-batches; a cancellation on rank 0 reaches the workers through the store
before their next micro-batch. The ranks sum gradients and
loss sums in fp32 before clipping; each then runs the same `generate` on the same gradient, so
momentum and result are identical on every rank (checked: the result's commitment hash is
compared across ranks after every `train`). `apply` runs the same code on every rank (rank 0
broadcasts the encoded results), and the weights hash is compared across ranks after loading
and after every apply; a mismatch raises `RankMismatch` naming the rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from psyche_client.distro import DistroResult, ResultLayout
from psyche_client.training.distro_backend import RNG_SEED, load_run_model
from psyche_client.training.model.loading import (
    ModelInfo,
    load_parameter_bytes,
    raw_parameters,
)
from psyche_client.training.parallel.collectives import (
    DataParallelSync,
    agree,
    broadcast_bytes,
    broadcast_object,
)
from psyche_client.training.parallel.commands import Apply, LoadModel, Train
from psyche_client.training.parallel.launch import RankGroups
from psyche_client.training.parallel.plan import split_samples
from psyche_client.training.trainer import Trainer, TrainOutput


class ReplicatedEngine:
    """One rank of a data-parallel client (the same methods run on every rank)."""

    def __init__(self, groups: RankGroups, trainer: Trainer, info: ModelInfo) -> None:
        self.groups = groups
        self.trainer = trainer
        self.info = info
        self.digest = b""
        self.trains = 0  # train commands so far: the same count on every rank
        self.holds_whole_model = True

    @classmethod
    def load(cls, groups: RankGroups, command: LoadModel) -> ReplicatedEngine:
        torch.manual_seed(RNG_SEED)
        model, info = load_run_model(
            command.source,
            command.revision,
            command.peer_config,
            groups.device,
            command.architecture,
            command.precision,
        )
        trainer = Trainer(
            model,
            command.optimizer,
            device=groups.device,
            micro_batch_size=command.micro_batch_size,
            grad_accum_in_fp32=command.precision.grad_accum_in_fp32,
        )
        engine = cls(groups, trainer, info)
        engine._check("weights hash after loading the model")
        return engine

    @property
    def layout(self) -> ResultLayout:
        return self.trainer.layout

    def train(self, command: Train, cancelled: Callable[[], bool]) -> TrainOutput:
        """This rank's share of the batch; raises `TrainingCancelled` on every rank alike."""
        tokens = command.tokens
        count = len(tokens)
        ranks = self.groups.world_size
        share = split_samples(count, ranks)[self.groups.rank]
        self.trains += 1
        sync = DataParallelSync(self.groups, count, key=f"stop-train/{self.trains}")
        output = self.trainer.train(
            command.batch,
            tokens[share.start : share.stop],
            command.step,
            command.lr,
            command.prev_lr,
            cancelled=cancelled,
            sync=sync,
        )
        assert output.result is not None
        agree(
            self.groups,
            output.result.data_hash(),
            f"result of step {command.step} {command.batch}",
        )
        return output

    def apply(self, command: Apply, results: Sequence[DistroResult] | None) -> None:
        payloads = broadcast_object(
            self.groups, [r.encode() for r in results] if results is not None else None
        )
        if results is None:
            results = [DistroResult.decode(p, self.trainer.layout) for p in payloads]
        self.trainer.apply(results, command.step, command.lr)
        self._check(f"weights hash after applying step {command.step}")

    def cancel(self) -> None:
        self.trainer.drop_pending_result()

    def load_parameters(self, parameters: Mapping[str, bytes] | None) -> None:
        model = self.trainer.model
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            size = param.numel() * param.element_size()
            data = broadcast_bytes(
                self.groups, parameters[name] if parameters is not None else None, size
            )
            load_parameter_bytes(model, name, data)
        self._check("weights hash after loading peer parameters")

    def export_parameters(self) -> list[tuple[str, str, tuple[int, ...], bytes]] | None:
        return raw_parameters(self.trainer.model) if self.groups.is_rank0 else None

    def checkpoint_state(self) -> dict[str, torch.Tensor] | None:
        if not self.groups.is_rank0:
            return None
        return {name: p.detach().cpu() for name, p in self.trainer.model.named_parameters()}

    def _check(self, what: str) -> None:
        digest = self.trainer.weights_digest()
        agree(self.groups, digest, what)
        self.digest = digest
