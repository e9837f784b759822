"""The real training backend: a Hugging Face causal LM trained with `psyche_client.training.trainer`.

Loads the model the coordinator's checkpoint names (`model.loading.load_model`: local directory,
`builtin:NAME` preset or Hub repo), builds the `Trainer` with the run's optimizer config, and
computes learning rates from the run's schedule (cold-start factor included). Results travel
as `DistroResult.encode()` bytes; `decode` checks them strictly against this model's layout,
the announced step/batch and the signed commitment before anything uses them.

`load_run_model` and `decode_checked` are the model loading and result checking shared with
the multi-device backend (`psyche_client.training.parallel`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from psyche_common.batch_id import BatchId
from psyche_common.config import AnyCheckpoint, AnyLRSchedule, Architecture, HubRepo
from psyche_common.config.architecture_rules import model_config_problem
from psyche_common.coordinator import Coordinator
from psyche_common.lr_schedule import effective_lr

from psyche_client.distro.result import DistroResult, ResultDecodeError, ResultLayout
from psyche_client.distro.size import encoded_result_size
from psyche_client.training.backend import (
    Capabilities,
    DecodedResult,
    Reference,
    Samples,
    TrainedResult,
    WarmupBounds,
    WeightsSnapshot,
)
from psyche_client.training.model.device import resolve_device
from psyche_client.training.model.loading import (
    ModelInfo,
    ModelLoadError,
    build_model_from_config,
    load_model,
    load_model_config,
    load_parameter_bytes,
    parameter_names,
    raw_parameters,
    save_checkpoint,
)
from psyche_client.training.model.numerics import configure_model, model_dtype
from psyche_client.training.model.precision import Precision
from psyche_client.training.trainer import Trainer, TrainingCancelled
from psyche_client.verify.agreement import gradient_coefficients, sign_agreement
from psyche_client.verify.copying import index_overlap
from psyche_client.verify.recompute import recompute_gradient

if TYPE_CHECKING:
    from transformers import PreTrainedModel

RNG_SEED = 1337


def checkpoint_source(checkpoint: AnyCheckpoint) -> HubRepo | None:
    """The model repository a coordinator checkpoint names (None for one that names none)."""
    repo = checkpoint.hub_repo()
    return repo if repo is not None and repo.repo_id else None


def load_run_model(
    source: str | None,
    revision: str | None,
    peer_config: dict[str, Any] | None,
    device: torch.device,
    architecture: Architecture,
    precision: Precision | None = None,
) -> tuple[torch.nn.Module, ModelInfo]:
    """The run's model on `device` in the dtype, attention kernel and checkpointing of
    `precision` (default: `Precision()`): built from a peer-shared `peer_config` (weights
    come later from peers), else loaded from `source` (local directory, `builtin:` or Hub).
    A model the run's `architecture` does not train is refused (`ModelLoadError`) before it
    is built."""
    if peer_config is None and not source:
        raise ValueError("the run's checkpoint names no model repository")
    check_architecture(architecture, peer_config, source, revision)
    precision = precision or Precision()
    dtype = model_dtype(precision, device)
    model, info = _load(source, revision, peer_config, device, dtype)
    return configure_model(model, precision, device), info


def _load(
    source: str | None,
    revision: str | None,
    peer_config: dict[str, Any] | None,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[torch.nn.Module, ModelInfo]:
    if peer_config is not None:
        model = build_model_from_config(peer_config, device=device, dtype=dtype)
        info = ModelInfo(
            source="p2p",
            kind="p2p",
            seeded=False,
            seed=None,
            path=None,
            config=peer_config,
            num_parameters=sum(p.numel() for p in model.parameters()),
        )
        return model, info
    assert source is not None
    return load_model(source, revision, device=device, dtype=dtype)


def check_architecture(
    architecture: Architecture,
    peer_config: dict[str, Any] | None,
    source: str | None,
    revision: str | None,
) -> None:
    """Raise `ModelLoadError` when the run's `architecture` does not train the model (the
    peer-shared config, else `source`'s config.json; `architecture_rules`)."""
    if peer_config is not None:
        config, where = peer_config, "shared by peers"
    else:
        assert source is not None
        config, where = load_model_config(source, revision), source
    problem = model_config_problem(architecture, config, where)
    if problem is not None:
        raise ModelLoadError(problem.message)


def decode_checked(
    payload: bytes, layout: ResultLayout, step: int, batch: BatchId, data_hash: bytes
) -> DistroResult:
    """Strictly decode a peer's result and check it against its announcement (step, batch)
    and its signed commitment; raises ValueError."""
    try:
        result = DistroResult.decode(payload, layout)
    except ResultDecodeError as exc:
        raise ValueError(f"malformed result: {exc}") from exc
    if result.step != step or result.batch_id != batch:
        raise ValueError(
            f"result is for step {result.step} {result.batch_id}, announced for step {step} {batch}"
        )
    if result.data_hash() != data_hash:
        raise ValueError("result bytes do not match the signed commitment")
    return result


class DistroBackend:
    def __init__(
        self,
        trainer: Trainer,
        info: ModelInfo,
        lr_schedule: AnyLRSchedule,
        warmup_bounds: WarmupBounds | None,
    ) -> None:
        self.trainer = trainer
        self.info = info
        self.lr_schedule = lr_schedule
        self.warmup_bounds = warmup_bounds
        self._weights_digest: bytes | None = None
        self.capabilities = Capabilities(
            model_info=info,
            verifier=self,
            live_model=self.live_model,
            optim_stats=self.take_optim_stats,
        )

    def live_model(self) -> torch.nn.Module:
        """The trainer's model, as it is now."""
        return self.trainer.model

    @classmethod
    def load(
        cls,
        coordinator: Coordinator,
        *,
        device: str,
        micro_batch_size: int,
        from_peers: bool = False,
        peer_config: dict[str, Any] | None = None,
        precision: Precision | None = None,
        optim_stats_steps: int = 0,
    ) -> DistroBackend:
        """Build the model for the coordinator's run. With ``peer_config`` (the config a peer
        majority shared) the model is built from it and its weights come later from
        `load_parameters`; otherwise it is loaded from the checkpoint's repository (and, when
        ``from_peers``, its weights are replaced by the peers' afterwards).
        ``optim_stats_steps`` N > 0 measures the optimizer every N steps
        (`take_optim_stats`)."""
        torch.manual_seed(RNG_SEED)
        llm = coordinator.model
        checkpoint = llm.checkpoint
        torch_device = resolve_device(device)
        source = checkpoint_source(checkpoint)
        if source is None and peer_config is None:
            raise ValueError(f"checkpoint {checkpoint!r} names no model repository")
        model, info = load_run_model(
            source.repo_id if source else None,
            source.revision if source else None,
            peer_config,
            torch_device,
            llm.architecture,
            precision,
        )
        trainer = Trainer(
            model,
            llm.optimizer,
            device=torch_device,
            micro_batch_size=micro_batch_size,
            grad_accum_in_fp32=(precision or Precision()).grad_accum_in_fp32,
            optim_stats_steps=optim_stats_steps,
        )
        bounds = coordinator.get_cold_start_warmup_bounds()
        return cls(trainer, info, llm.lr_schedule, bounds)

    def begin_round(self, warmup_bounds: WarmupBounds | None) -> None:
        """Refresh what changes per epoch (the cold-start bounds)."""
        self.warmup_bounds = warmup_bounds

    def lr(self, step: int) -> float:
        return effective_lr(self.lr_schedule, step, self.warmup_bounds)

    def train(
        self, step: int, batch: BatchId, samples: Samples | None, cancelled: Callable[[], bool]
    ) -> TrainedResult | None:
        if samples is None:
            raise ValueError(f"step {step} {batch}: the DisTrO backend trains on samples, got none")
        tokens = np.asarray(samples, dtype=np.int64)
        if not self.trainer.is_distro:
            self._weights_digest = None  # an AdamW trainer steps its weights in `train`
        try:
            output = self.trainer.train(
                batch, tokens, step, self.lr(step), self.lr(step - 1), cancelled=cancelled
            )
        except TrainingCancelled:
            return None
        if output.result is None:
            raise RuntimeError("the run's optimizer is not DisTrO: nothing to share with peers")
        payload = output.result.encode()
        return TrainedResult(
            loss=output.loss,
            payload=payload,
            data_hash=output.result.data_hash(),
            tokens=int(tokens.size),
        )

    def take_optim_stats(self) -> list[tuple[int, dict[str, float]]]:
        """The optimizer statistics measured since the last call (`--optim-stats-steps`)."""
        return self.trainer.optim_stats.take()

    def decode(self, step: int, batch: BatchId, payload: bytes, data_hash: bytes) -> DistroResult:
        return decode_checked(payload, self.trainer.layout, step, batch, data_hash)

    def result_size(self) -> int:
        """The exact result size (0 for a run whose optimizer shares no results)."""
        if not self.trainer.is_distro:
            return 0
        return encoded_result_size(self.trainer.layout)

    def apply(self, step: int, results: Sequence[DecodedResult]) -> None:
        distro_results = [r for r in results if isinstance(r, DistroResult)]
        if len(distro_results) != len(results):
            raise TypeError("DistroBackend applies only DistroResults")
        self._weights_digest = None
        self.trainer.apply(distro_results, step, self.lr(step))
        # hash here, in the caller's worker thread, not later on the event loop
        self._weights_digest = self.trainer.weights_digest()

    def recompute(
        self, samples: Samples, step: int = 0, along: DecodedResult | None = None
    ) -> Reference | None:
        """The DCT coefficients of the plain gradient of `samples` (a verifier's reference,
        `psyche_client.verify`) at the point the trainer of step `step` trained at: the
        current weights, or with `along` (that trainer's published result of step − 1, still
        in flight) its lookahead point `theta − lr(step−1)·sign(IDCT(along))`
        (`distro.lookahead`); the weights are restored exactly. None unless the run is
        DisTrO."""
        compressor = self.trainer.optimizer.verifier_compressor
        if compressor is None:
            return None
        if along is not None and not isinstance(along, DistroResult):
            raise ValueError("a DisTrO lookahead needs a DistroResult")
        tokens = np.asarray(samples, dtype=np.int64)
        lr = self.lr(step - 1) if along is not None else 0.0
        with self.trainer.optimizer.verifier_point(along, lr):
            grads = recompute_gradient(
                self.trainer.model, tokens, self.trainer.micro_batch_size, self.trainer.device
            )
        return gradient_coefficients(compressor, grads)

    def agreement(self, reference: Reference, result: DecodedResult) -> float:
        """The |coefficient|-weighted sign agreement of `result` with `reference`."""
        if not isinstance(result, DistroResult):
            raise ValueError("agreement needs a DistroResult")
        return sign_agreement(result, reference).weighted

    def overlap(self, result: DecodedResult, other: DecodedResult) -> float:
        """The top-k index overlap of two DisTrO results (`verify.copying.index_overlap`)."""
        if not isinstance(result, DistroResult) or not isinstance(other, DistroResult):
            raise ValueError("overlap needs two DistroResults")
        return index_overlap(
            [t.indices() for t in result.tensors], [t.indices() for t in other.tensors]
        )

    def snapshot(self) -> WeightsSnapshot:
        """Copies of every parameter on its device, with the weights hash they have."""
        with torch.no_grad():
            copies = [p.detach().clone() for p in self.trainer.model.parameters()]
        return (copies, self.weights_hash())

    def restore(self, snapshot: WeightsSnapshot) -> None:
        assert isinstance(snapshot, tuple)
        copies, digest = snapshot
        with torch.no_grad():
            for parameter, saved in zip(self.trainer.model.parameters(), copies, strict=True):
                parameter.copy_(saved)
        self._weights_digest = digest

    def cancel_round(self) -> None:
        self.trainer.drop_pending_result()

    def weights_hash(self) -> bytes:
        """The weights hash, cached: with DisTrO the weights change only in `apply` and
        `load_parameters` (`train`'s lookahead restores them exactly), and a full pass over
        the parameters costs ~0.1 s per 20M parameters (three calls per round)."""
        if self._weights_digest is None:
            self._weights_digest = self.trainer.weights_digest()
        return self._weights_digest

    def export_parameters(self) -> list[tuple[str, str, tuple[int, ...], bytes]]:
        return raw_parameters(self.trainer.model)

    def load_parameters(self, parameters: dict[str, bytes]) -> None:
        model = self.trainer.model
        expected = parameter_names(model)
        if set(parameters) != expected:
            missing = sorted(expected - set(parameters))[:3]
            extra = sorted(set(parameters) - expected)[:3]
            raise ValueError(f"peer model does not match: missing {missing}, unexpected {extra}")
        self._weights_digest = None
        for name, data in parameters.items():
            load_parameter_bytes(model, name, data)
        # weights from peers (a late join or a resync): the momentum built on the old weights
        # restarts from zero
        self.trainer.reset_optimizer_state()
        self._weights_digest = self.trainer.weights_digest()

    def save_checkpoint(self, directory: str) -> None:
        model = cast("PreTrainedModel", self.trainer.model)  # loaded by `load_model`
        save_checkpoint(model, directory, extra_files=self.info.extra_files)
