"""In-process training runs of the real DisTrO backend on a chosen device.

The GPU suite (`tests/cuda`) runs these bodies with `device="cuda"`; their CPU twins
(`tests/integration/test_device_training.py`) run the very same bodies with `device="cpu"` in
`make test`, so the logic a GPU machine checks is known to work before one is available.

`train_pair` is what two clients do: each trains its own batch, then both decode and apply
both results (in opposite orders: the apply sorts them) and report their weights hashes. The
two backends may live on different devices (the cross-device apply check) or in different
dtypes. The batches repeat a few fixed, learnable sequences, so the loss falls within a
handful of steps on any device.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from psyche_client.training.distro_backend import DistroBackend
from psyche_client.training.model.precision import DtypeName, Precision
from psyche_client.training.trainer import weights_digest
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Coordinator, RunState
from transformers import AutoModelForCausalLM, PreTrainedModel

from tests.support.coordinators import coordinator_in, distro_model, ids
from tests.support.model_families import write_family

SEQ_LEN = 16
SAMPLES = 2  # per client per step
MICRO_BATCH = 2
LEARNING_RATE = 1e-2
"""Constant lr of these runs: DisTrO moves every weight by ±lr per step, and at this size a
few steps of it visibly lower the loss of the repeated sequences."""


def warmup(
    model: str | Path = "builtin:llama-tiny", architecture: str = "HfLlama", one_bit: bool = True
) -> Coordinator:
    """The Warmup (where backends load) of a DisTrO run of `model` (a preset or a directory),
    sending 1-bit values (`one_bit`) or bf16 ones."""
    llm = distro_model(str(model), chunk=16, topk=4, max_seq_len=SEQ_LEN, quantize_1bit=one_bit)
    llm["lr_schedule"] = {
        "Constant": {"base_lr": LEARNING_RATE, "warmup_init_lr": 0.0, "warmup_steps": 0}
    }
    return coordinator_in(RunState.Warmup, ids(2), model=llm | {"architecture": architecture})


def tied_qwen2_warmup(directory: Path) -> Coordinator:
    """A Warmup of the tiny tied Qwen2 (`model_families`), written under `directory`."""
    return warmup(write_family(directory / "qwen2-tied", "qwen2-tied"), "HfAuto")


def load(coordinator: Coordinator, device: str, dtype: DtypeName) -> DistroBackend:
    return DistroBackend.load(
        coordinator, device=device, micro_batch_size=MICRO_BATCH, precision=Precision(dtype=dtype)
    )


def tokens(client: int) -> np.ndarray:
    """Client `client`'s samples, the same at every step: arithmetic runs of byte tokens (a
    pattern a 2-layer model learns quickly)."""
    rows = [
        (np.arange(SEQ_LEN) * (3 + 2 * row) + 17 * (client * SAMPLES + row)) % 256
        for row in range(SAMPLES)
    ]
    return np.stack(rows).astype(np.int64)


@dataclass(frozen=True)
class PairRun:
    """What two clients trained and held: per step their losses and, after applying both
    results, their weights hashes."""

    initial: tuple[bytes, bytes]
    losses: list[tuple[float, float]]
    hashes: list[tuple[bytes, bytes]]


def train_pair(a: DistroBackend, b: DistroBackend, steps: int) -> PairRun:
    """`steps` rounds: `a` and `b` each train their own batch, then both apply both results
    (each decoded by the backend that applies it)."""
    initial = (a.weights_hash(), b.weights_hash())
    losses, hashes = [], []
    for step in range(1, steps + 1):
        trained = []
        for index, backend in enumerate((a, b)):
            first = 100 * step + SAMPLES * index
            batch = BatchId(first, first + SAMPLES - 1)
            out = backend.train(step, batch, tokens(index), lambda: False)
            assert out is not None, f"client {index} did not train step {step}"
            trained.append((batch, out))
        for backend, order in ((a, trained), (b, trained[::-1])):
            backend.apply(
                step, [backend.decode(step, bt, o.payload, o.data_hash) for bt, o in order]
            )
        losses.append((trained[0][1].loss, trained[1][1].loss))
        hashes.append((a.weights_hash(), b.weights_hash()))
    return PairRun(initial, losses, hashes)


def parameter_devices(backend: DistroBackend) -> set[str]:
    return {p.device.type for p in backend.trainer.model.parameters()}


def parameter_dtypes(backend: DistroBackend) -> set[torch.dtype]:
    return {p.dtype for p in backend.trainer.model.parameters()}


def is_tied(model: torch.nn.Module) -> bool:
    """Whether the input and output embeddings are one tensor."""
    assert isinstance(model, PreTrainedModel)
    output = model.get_output_embeddings()
    return output is not None and output.weight is model.get_input_embeddings().weight


@dataclass(frozen=True)
class Reloaded:
    """A checkpoint reloaded in transformers on the CPU, in the dtype it was saved in."""

    tied: bool
    weights_hash: bytes
    device: str


def reload_checkpoint(backend: DistroBackend) -> Reloaded:
    """Save `backend`'s checkpoint and load it back with transformers on the CPU."""
    dtype = next(backend.trainer.model.parameters()).dtype
    with tempfile.TemporaryDirectory() as directory:
        backend.save_checkpoint(directory)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
        return Reloaded(is_tied(model), weights_digest(model), next(model.parameters()).device.type)


# ---------------------------------------------------------------------------- the checks


def check_bf16_training(device: str, dtype: DtypeName = "bf16", steps: int = 6) -> PairRun:
    """Two bf16 clients on `device` (with `dtype`, which must come out bf16 there): bf16
    parameters on that device, fp32 momentum, a finite loss that falls, and bit-identical
    weights hashes after every apply, each step changing them."""
    coordinator = warmup()
    a, b = load(coordinator, device, dtype), load(coordinator, device, dtype)
    for backend in (a, b):
        assert parameter_devices(backend) == {torch.device(device).type}
        assert parameter_dtypes(backend) == {torch.bfloat16}
    run = train_pair(a, b, steps)
    distro = a.trainer.distro
    assert distro is not None
    name = "model.layers.0.mlp.up_proj.weight"
    assert distro.momentum(name).dtype == torch.float32  # type: ignore[union-attr]
    check_falling_losses(run)
    check_identical_hashes(run)
    return run


def check_tied_training(device: str, directory: Path, dtype: DtypeName, steps: int = 3) -> None:
    """Two clients of the tied Qwen2 on `device`: the embedding is one tensor (compressed
    once), the clients stay bit-identical, the tie survives training and applying, and the
    checkpoint one of them writes reloads in transformers on the CPU tied, with its weights."""
    coordinator = tied_qwen2_warmup(directory)
    a, b = load(coordinator, device, dtype), load(coordinator, device, dtype)
    model = a.trainer.model
    assert is_tied(model) and parameter_devices(a) == {torch.device(device).type}
    distinct = {id(p) for p in model.parameters()}
    assert len(a.trainer.layout.tensors) == len(distinct)  # the tied tensor is compressed once
    run = train_pair(a, b, steps)
    assert all(np.isfinite(loss) for pair in run.losses for loss in pair), run.losses
    check_identical_hashes(run)
    assert is_tied(a.trainer.model) and is_tied(b.trainer.model)
    reloaded = reload_checkpoint(a)
    assert reloaded.device == "cpu"
    assert reloaded.tied
    assert reloaded.weights_hash == a.weights_hash()


def check_cross_device_apply(device_a: str, device_b: str, one_bit: bool, steps: int = 4) -> None:
    """One fp32 client on `device_a`, one on `device_b`, from the same seeded weights: each
    trains its own batch on its own device, both apply both results, and their weights stay
    bit-identical (the decode is exact and the step is sign times lr, whatever the device)."""
    coordinator = warmup(one_bit=one_bit)
    a, b = load(coordinator, device_a, "fp32"), load(coordinator, device_b, "fp32")
    assert parameter_devices(a) == {torch.device(device_a).type}
    assert parameter_devices(b) == {torch.device(device_b).type}
    assert parameter_dtypes(a) == parameter_dtypes(b) == {torch.float32}
    run = train_pair(a, b, steps)
    check_identical_hashes(run)


def check_falling_losses(run: PairRun) -> None:
    """Every loss finite; each client's mean over the last two steps at least 0.5 below its
    first step's (the repeated sequences start near ln 256 = 5.5)."""
    assert all(np.isfinite(loss) for pair in run.losses for loss in pair), run.losses
    for client in (0, 1):
        series = [pair[client] for pair in run.losses]
        assert float(np.mean(series[-2:])) < series[0] - 0.5, series


def check_identical_hashes(run: PairRun) -> None:
    """Both clients start equal and hold the same weights after every step, each step
    changing them."""
    assert run.initial[0] == run.initial[1]
    previous = run.initial[0]
    for step, (hash_a, hash_b) in enumerate(run.hashes, start=1):
        assert hash_a == hash_b, f"the clients' weights differ after step {step}"
        assert hash_a != previous, f"step {step} left the weights unchanged"
        previous = hash_a
