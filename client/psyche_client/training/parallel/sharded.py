"""The sharded mode: a model sharded with `fully_shard` over the client's ranks, each rank
training a share of every batch, DisTrO state split by parameter owner.

Per `train` (see `sharded_model` for the layout):
1. lookahead (only after training the step before: `distro.in_flight`): each owner computes
   `theta - prev_lr * sign(delta)` on its full copy and scatters the rows into every shard;
   after forward/backward the owners scatter their unchanged full copies again, which
   restores the shards exactly;
2. forward/backward over micro-batch slots in lockstep: every rank asks the others before each
   slot whether to stop, runs a zero-weight filler micro-batch when its share has no micro-batch
   for a slot (FSDP2's collectives need every rank), and when any rank's micro-batch loss is not
   finite every rank skips that slot's backward; gradients are reduce-scattered as sums
   (micro-batch weights are shares of the whole batch, as on one device);
3. clipping uses the global norm (per-parameter squared norms of the shards, summed over the
   ranks); then, one parameter at a time, the owner gathers the full gradient and runs that
   parameter's `DistroOptimizer.generate`; rank 0 gathers the payloads and assembles the result
   in the model's sorted-name layout, so its bytes are a single-device client's for the same
   gradient.

`apply` sends each owner its parameters' part of every result (`ResultPart`, ordered like the
whole result), runs the same `DistroOptimizer.apply` as a single-device client on the owner's
full copy, and scatters the new rows into the shards; the weights hash is then streamed to rank
0 parameter by parameter, so it equals a single-device peer's. Each owned parameter has its own
single-parameter `DistroOptimizer`, so a full gradient exists for one parameter at a time.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from psyche_client.distro import (
    DistroOptimizer,
    DistroResult,
    DistroSettings,
    OwnResult,
    ResultLayout,
    TensorPayload,
)
from psyche_client.distro.in_flight import OwnSteps
from psyche_client.distro.lookahead import lookahead_step
from psyche_client.training.model.params import hash_parameters, raw_entry
from psyche_client.training.parallel.collectives import (
    any_rank,
    gather_object,
    gather_rows,
    scatter_object,
    sum_floats,
)
from psyche_client.training.parallel.commands import Apply, LoadModel, Train
from psyche_client.training.parallel.launch import RankGroups
from psyche_client.training.parallel.plan import micro_batch_slots, split_samples
from psyche_client.training.parallel.sharded_model import ShardedModel, load_sharded
from psyche_client.training.trainer import TrainingCancelled, TrainOutput

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResultPart(DistroResult):
    """The tensors of one result that one rank owns; sorts like the whole result."""

    whole_hash: bytes = b""

    def data_hash(self) -> bytes:
        return self.whole_hash


class ShardedEngine:
    """One rank of a sharded client (the same methods run on every rank)."""

    def __init__(
        self, model: ShardedModel, settings: DistroSettings, micro_batch_size: int
    ) -> None:
        self.model = model
        self.groups = model.groups
        self.info = model.info
        self.settings = settings
        self.micro_batch_size = micro_batch_size
        self.optimizers = {
            name: DistroOptimizer([(name, master)], settings)
            for name, master in sorted(model.masters.items())
        }
        self.layout = ResultLayout.for_parameters(
            model.shapes.items(),
            settings.compression_chunk,
            settings.compression_topk,
            settings.value_kind,
        )
        self.pending_own: dict[str, OwnResult] = {}
        self.published: dict[str, TensorPayload] = {}
        """Per owned parameter: its payload in this client's last result (this rank's part of
        the lookahead direction: `distro.lookahead`)."""
        self.published_step: int | None = None
        """The step of that result (None: none in flight); the same on every rank."""
        self.own_steps = OwnSteps()
        """Which own result the lookahead anticipates (the same on every rank)."""
        self.trainer_nonce = 0
        self.digest = b""
        self.holds_whole_model = False

    @classmethod
    def load(cls, groups: RankGroups, command: LoadModel) -> ShardedEngine:
        engine = cls(load_sharded(groups, command), command.optimizer, command.micro_batch_size)
        engine._refresh("shards after loading the model")
        return engine

    # ---- training ------------------------------------------------------------------------
    def train(self, command: Train, cancelled: Callable[[], bool]) -> TrainOutput | None:
        """This rank's share; the result on rank 0 (None elsewhere). Raises
        `TrainingCancelled` on every rank alike, with the shards restored."""
        nonce = self.trainer_nonce
        self.trainer_nonce += 1
        module = self.model.module
        module.zero_grad(set_to_none=True)
        started = time.perf_counter()
        looked_ahead = self._lookahead(
            self.own_steps.lookahead_lr(command.step, command.prev_lr), command.step - 1
        )
        try:
            loss, used, skipped = self._forward_backward(command, cancelled)
        except TrainingCancelled:
            module.zero_grad(set_to_none=True)
            raise
        finally:
            if looked_ahead:
                self.model.push_masters()
        forward_backward = time.perf_counter() - started
        started = time.perf_counter()
        grad_norm, coefficient = self._clip_coefficient()
        own: dict[str, OwnResult] = {}
        payloads: list[tuple[str, TensorPayload]] = []
        for name, param in self.model.params:
            local = param.grad.to_local() if param.grad is not None else None
            if local is None:
                local = torch.zeros_like(self.model.local(param))
            full = gather_rows(self.groups, local, self.model.owners[name], self.model.rows[name])
            if full is None:
                continue
            if coefficient is not None:
                full.mul_(coefficient.to(device=full.device, dtype=full.dtype))
            master = self.model.masters[name]
            master.grad = full.reshape(master.shape)
            previous = [self.pending_own[name]] if name in self.pending_own else []
            generated = self.optimizers[name].generate(
                command.lr, command.step, command.batch, nonce, previous
            )
            master.grad = None
            own[name] = generated.own
            payloads.append((name, generated.transmit.tensors[0]))
            self.published[name] = generated.transmit.tensors[0]
        module.zero_grad(set_to_none=True)
        self.pending_own = own
        self.published_step = command.step
        self.own_steps.trained(command.step)
        parts = gather_object(self.groups, payloads)
        if parts is None:
            return None
        by_name = dict(chain.from_iterable(parts))
        result = DistroResult(
            command.step,
            command.batch,
            nonce,
            self.layout.value_kind,
            tuple(by_name[tensor.name] for tensor in self.layout.tensors),
        )
        return TrainOutput(
            loss=loss,
            result=result,
            grad_norm=grad_norm,
            micro_batches=used,
            skipped_micro_batches=skipped,
            forward_backward_seconds=forward_backward,
            optimizer_seconds=time.perf_counter() - started,
        )

    @torch.no_grad()
    def _lookahead(self, prev_lr: float, along_step: int) -> bool:
        """Move every shard to `theta - prev_lr * sign(IDCT(r))`, `r` the owner's part of this
        client's published result of `along_step` (`distro.lookahead`); False when there is
        nothing to do (`prev_lr` 0, or no published result of that step: the shards are left
        as they are). Every rank decides alike: `own_steps` and the published steps are the
        same on every rank."""
        if prev_lr == 0.0 or self.published_step != along_step:
            return False
        for name, param in self.model.params:
            full = None
            master = self.model.masters.get(name)
            if master is not None:
                full = master.detach().clone()
                step = lookahead_step(
                    self.optimizers[name].compressor, 0, self.published[name], full
                )
                full.add_(step, alpha=-prev_lr)
            self.model.push(name, param, full)
        return True

    def _forward_backward(
        self, command: Train, cancelled: Callable[[], bool]
    ) -> tuple[float, int, int]:
        tokens = np.asarray(command.tokens, dtype=np.int64)
        count = len(tokens)
        ranks = self.groups.world_size
        share = split_samples(count, ranks)[self.groups.rank]
        device = self.groups.device
        mine = torch.from_numpy(tokens[share.start : share.stop]).to(device)
        micro_batches = torch.split(mine, self.micro_batch_size) if len(mine) else ()
        filler = torch.from_numpy(tokens[:1]).to(device)  # zero-weight stand-in for a free slot
        module = self.model.module
        module.train()
        loss_sum, counted, skipped = 0.0, 0, 0
        for slot in range(micro_batch_slots(count, ranks, self.micro_batch_size)):
            if any_rank(self.groups, cancelled()):
                raise TrainingCancelled("training cancelled before a micro-batch")
            real = slot < len(micro_batches)
            batch = micro_batches[slot] if real else filler
            loss = module(input_ids=batch, labels=batch).loss
            value = float(loss.detach())
            if any_rank(self.groups, real and not math.isfinite(value)):
                skipped += 1 if real else 0
                log.warning(
                    "step %d: a micro-batch loss is not finite on some rank: "
                    "every rank skips micro-batch slot %d",
                    command.step,
                    slot,
                )
                continue
            weight = batch.shape[0] / count if real else 0.0
            (loss * weight).backward()
            if real:
                loss_sum += value * weight
                counted += batch.shape[0]
        total_loss, total_counted = sum_floats(self.groups, [loss_sum, counted])
        mean = total_loss * count / total_counted if total_counted else math.nan
        return mean, len(micro_batches), skipped

    @torch.no_grad()
    def _clip_coefficient(self) -> tuple[float | None, torch.Tensor | None]:
        """The global gradient norm and the clipping factor (None: no clipping)."""
        max_norm = self.settings.clip_grad_norm
        if max_norm is None or max_norm <= 0:
            return None, None
        squares = []
        for _, param in self.model.params:
            grad = param.grad.to_local() if param.grad is not None else None
            squares.append(0.0 if grad is None else float(grad.double().pow(2).sum()))
        norms = torch.tensor(sum_floats(self.groups, squares), dtype=torch.float64).sqrt()
        total = torch.linalg.vector_norm(norms.float(), 2.0)
        return float(total), torch.clamp(max_norm / (total + 1e-6), max=1.0)

    # ---- applying --------------------------------------------------------------------------
    def apply(self, command: Apply, results: Sequence[DistroResult] | None) -> None:
        parts = scatter_object(self.groups, self._split(results) if results is not None else None)
        if any_rank(self.groups, bool(parts)):
            for i, name in enumerate(sorted(self.optimizers)):
                self.optimizers[name].apply([part[i] for part in parts], command.lr)
            self.model.push_masters()
        self._refresh(f"shards after applying step {command.step}")

    def _split(self, results: Sequence[DistroResult]) -> list[list[list[ResultPart]]]:
        """Per rank, per owned parameter (ascending), per result: that parameter's part."""
        index = {tensor.name: i for i, tensor in enumerate(self.layout.tensors)}
        per_rank = []
        for rank in range(self.groups.world_size):
            names = sorted(n for n, owner in self.model.owners.items() if owner == rank)
            per_rank.append(
                [
                    [
                        ResultPart(
                            r.step,
                            r.batch_id,
                            r.trainer_nonce,
                            r.value_kind,
                            (r.tensors[index[name]],),
                            r.data_hash(),
                        )
                        for name in names
                    ]
                    for r in results
                ]
            )
        return per_rank

    def cancel(self) -> None:
        self.pending_own = {}
        self.published = {}
        self.published_step = None

    # ---- the whole model on rank 0 -----------------------------------------------------------
    def load_parameters(self, parameters: Mapping[str, bytes] | None) -> None:
        self.model.load_bytes(parameters)
        self._refresh("shards after loading peer parameters")

    def export_parameters(self) -> list[tuple[str, str, tuple[int, ...], bytes]] | None:
        entries = [raw_entry(name, value) for name, value in self.model.stream_to_rank0()]
        return entries if self.groups.is_rank0 else None

    def checkpoint_state(self) -> dict[str, torch.Tensor] | None:
        state = {name: value.detach().cpu() for name, value in self.model.stream_to_rank0()}
        return state if self.groups.is_rank0 else None

    def _refresh(self, what: str) -> None:
        self.model.verify(what)
        digest = hash_parameters(self.model.stream_to_rank0())
        self.digest = digest if self.groups.is_rank0 else b""
