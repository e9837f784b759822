"""Resource estimate of a run for one client: memory per component and DisTrO bytes per step.

`estimate_run(llm_config, model_config, micro_batch_size, device, precision=...)` builds the
model on the `meta` device (no memory, exact parameter shapes), then adds up what the trainer
really holds at its peak, the end of a micro-batch's backward pass (docs/client.md, "Precision
and memory"):
  * the process's baseline: python, torch and transformers (this process's resident memory,
    which like the client's has imported them, on the CPU; a CUDA context on a GPU);
  * parameters and gradients in the training dtype (`Precision.resolved`), with
    `--grad-accum-in-fp32` the fp32 gradient sums;
  * optimizer state: DisTrO's fp32 momentum, the weights saved to undo the lookahead and the
    snapshot taken before an early apply (both in the training dtype), or SparseLoCo's / AdamW's;
  * activations of one micro-batch at `max_seq_len`, for Llama-style decoder blocks: per token
    and layer ~ 12h + 4·kv + 4·intermediate saved elements (RMSNorm's fp32 copies count 4 bytes
    in a bf16 model), the attention scores only with the eager kernel, only each layer's input
    with activation checkpointing (plus one layer recomputed); and the logits with the loss:
    logits, fp32 log-probabilities and both their gradients;
  * the results held: the own result encoded and every client's results of two rounds;
  * DisTrO's working memory, one parameter at a time, so the largest one's: `generate`'s DCT
    of the fp32 momentum (its tiles and their magnitudes: 2 fp32 copies) and `apply`'s
    float64 aggregate and inverse DCT (3 float64 copies and 2 in the dtype, counted at half).
    They come after the backward pass, yet add to its peak: the allocator keeps much of the
    memory training freed, and reuses only part of it for them. The half is calibrated, not
    derived: bench/memory.py measured `builtin:llama-20m` and a 134M Llama on the CPU
    (docs/benchmarks.md), where the full count overshot the larger model by 22 %;
  * the size of one encoded result (DisTrO or SparseLoCo), exact: the result codec's own size
    of the run's layout (`psyche_client.distro.size`), what every client sends each step.
It compares the total with the free memory of the device (MemAvailable of /proc/meminfo for the
CPU, `torch.cuda.mem_get_info` for CUDA). With a multi-device `parallel` layout the memory rows
are per device (`estimate_parallel`); CPU ranks share the host's memory, so there the total
of all ranks is compared with it. `Estimate.render()` gives a text table. `bench/memory.py`
measures a client's peak against this estimate (figures in docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from psyche_client.distro.parameters import STATE_DTYPE
from psyche_client.distro.result import ResultLayout
from psyche_client.distro.size import encoded_result_size
from psyche_client.distro.values import value_kind_named
from psyche_client.tools.estimate_parallel import per_device_memory
from psyche_client.training.model.device import resolve_device
from psyche_client.training.model.loading import config_from_dict
from psyche_client.training.model.numerics import torch_dtype
from psyche_client.training.model.precision import Precision
from psyche_client.training.parallel.plan import ParallelSpec
from psyche_client.units import format_bytes

FIT_MARGIN = 0.9  # use at most this share of the free memory
STATE_BYTES = torch.empty((), dtype=STATE_DTYPE).element_size()


# ---------------------------------------------------------------- result size


def result_bytes(shapes: Iterable[tuple[str, Sequence[int]]], optimizer: Any) -> int:
    """Bytes of one encoded result of this client (`DistroResult.encode()`, docs/distro.md,
    "The result format (version 2)") for a DisTrO or SparseLoCo `optimizer` config: the exact
    size the result codec gives the run's layout."""
    kind = value_kind_named(optimizer.resolved_value_format())
    layout = ResultLayout.for_parameters(
        shapes,
        int(_read(optimizer, "compression_chunk")),
        int(_read(optimizer, "compression_topk")),
        kind,
    )
    return encoded_result_size(layout)


# ---------------------------------------------------------------- memory


def free_memory_bytes(device: torch.device) -> int | None:
    """Free memory usable on `device`, or None when it cannot be measured."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def _meta_model(config: PretrainedConfig) -> torch.nn.Module:
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _shapes(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return sorted((name, tuple(p.shape)) for name, p in model.named_parameters())


CUDA_CONTEXT_BYTES = 512 * 1024**2
"""Device memory a CUDA context and torch's kernels take before any tensor (approximate)."""
FALLBACK_BASELINE_BYTES = 400 * 1024**2
"""Python, torch and transformers resident on the CPU when this process's cannot be read."""
FP32 = 4
APPLY_RETAINED_SHARE = 2
"""The apply's working memory adds this fraction (1/2) to the peak (see the module doc)."""


def process_baseline_bytes(device: torch.device) -> int:
    """Memory the client's process needs before its model: on the CPU this process's resident
    set (it has imported torch and transformers, as the client has), on CUDA the context."""
    if device.type == "cuda":
        return CUDA_CONTEXT_BYTES
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return FALLBACK_BASELINE_BYTES


def activation_bytes(
    config: PretrainedConfig,
    micro_batch_size: int,
    seq_len: int,
    elem: int,
    precision: Precision | None = None,
) -> int:
    """Saved activations of one micro-batch's decoder blocks (see module doc), in bytes."""
    precision = precision or Precision()
    hidden = int(config.hidden_size)
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
    kv_dim = hidden // heads * kv_heads
    tokens = micro_batch_size * seq_len
    # RMSNorm computes in fp32: its input copy and normalised output are fp32 in any dtype
    norms = 2 * 2 * hidden * (FP32 - elem)
    per_layer = (12 * hidden + 4 * kv_dim + 4 * intermediate) * elem + norms
    if precision.attn_implementation == "eager":
        per_layer += 2 * heads * seq_len * elem  # scores and their softmax, per query token
    if precision.activation_checkpointing:  # each layer's input, plus one layer recomputed
        return tokens * (layers * hidden * elem + per_layer) + tokens * hidden * elem
    return tokens * layers * per_layer + tokens * hidden * elem


def logits_bytes(config: PretrainedConfig, micro_batch_size: int, seq_len: int, elem: int) -> int:
    """The logits of one micro-batch and the loss over them at the backward pass's peak. In
    an fp32 model: logits, log-probabilities and both their gradients (the upcast for the loss
    is the same tensor). In a lower dtype: the logits, their fp32 copy, the fp32
    log-probabilities and one fp32 gradient, the gradient of the copy being made as that of
    the log-probabilities is freed (the dtype's own gradient reuses that memory): measured on
    the CPU, 14.4 bytes a logit in bf16 against 19.4 in fp32, the weight's gradient included."""
    per_logit = 4 * FP32 if elem == FP32 else elem + 3 * FP32
    return micro_batch_size * seq_len * int(config.vocab_size) * per_logit


@dataclass(frozen=True)
class Estimate:
    """What one client needs for a run, and whether it fits the local device."""

    device: str
    dtype: str
    num_parameters: int
    micro_batch_size: int
    max_seq_len: int
    memory: list[tuple[str, int]]
    free_bytes: int | None
    optimizer: str
    distro_result_bytes: int | None = None
    num_clients: int | None = None
    notes: list[str] = field(default_factory=list)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)

    @property
    def total_bytes(self) -> int:
        """Memory of one device (of every device alike with a multi-device layout)."""
        return sum(size for _, size in self.memory)

    @property
    def shares_free_memory(self) -> bool:
        """All ranks draw on the same free memory (CPU ranks share the host's)."""
        return self.parallel.enabled and self.device.startswith("cpu")

    @property
    def needed_bytes(self) -> int:
        """What must fit into `free_bytes`."""
        ranks = self.parallel.world_size if self.shares_free_memory else 1
        return self.total_bytes * ranks

    @property
    def fits(self) -> bool | None:
        if self.free_bytes is None:
            return None
        return self.needed_bytes <= self.free_bytes * FIT_MARGIN

    @property
    def distro_download_bytes_per_step(self) -> int | None:
        if self.distro_result_bytes is None or self.num_clients is None:
            return None
        return self.distro_result_bytes * max(0, self.num_clients - 1)

    def render(self) -> str:
        rows: list[tuple[str, str]] = [
            ("parameters", f"{self.num_parameters:,} ({self.dtype})"),
            ("devices", self._devices()),
            ("micro-batch", f"{self.micro_batch_size} x {self.max_seq_len} tokens"),
            ("optimizer", self.optimizer),
        ]
        memory = "memory per device" if self.parallel.enabled else "memory"
        rows += [(f"{memory}: {label}", format_bytes(size)) for label, size in self.memory]
        rows.append((f"{memory}: total (approx.)", format_bytes(self.total_bytes)))
        if self.shares_free_memory:
            ranks = self.parallel.world_size
            rows.append((f"memory of all {ranks} ranks (shared)", format_bytes(self.needed_bytes)))
        free = "unknown" if self.free_bytes is None else format_bytes(self.free_bytes)
        rows.append((f"free on {self.device}", free))
        verdict = {True: "yes", False: "NO", None: "unknown"}[self.fits]
        rows.append(("fits", verdict))
        if self.distro_result_bytes is not None:
            size = self.distro_result_bytes
            rows.append(("DisTrO upload per step", f"{size:,} bytes ({format_bytes(size)})"))
            download = self.distro_download_bytes_per_step
            if download is not None:
                rows.append(
                    (
                        f"DisTrO download per step ({self.num_clients} clients)",
                        format_bytes(download),
                    )
                )
        width = max(len(label) for label, _ in rows)
        lines = [f"{label:<{width}}  {value}" for label, value in rows]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def _devices(self) -> str:
        spec = self.parallel
        if not spec.enabled:
            return f"1 ({self.device})"
        layout = "model sharded (--fsdp)" if spec.fsdp else "a full replica each"
        return f"{spec.world_size} ranks on {self.device.split(':')[0]}, {layout}"


def _read(obj: Any, name: str, default: Any = None) -> Any:
    return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)


def estimate_run(
    llm_config: Any,
    model_config: dict[str, Any] | PretrainedConfig,
    micro_batch_size: int,
    device: torch.device | str = "cpu",
    *,
    precision: Precision | None = None,
    num_clients: int | None = None,
    parallel: ParallelSpec | None = None,
    batch_size: int | None = None,
) -> Estimate:
    """Estimate one client's memory (per device, with a multi-device `parallel` layout) and
    DisTrO traffic for a run.

    `llm_config` is `psyche_common.config.LLMConfig` (reads `max_seq_len` and `optimizer`);
    `model_config` is the model's config.json dict or a transformers config. `precision`
    gives the training dtype (`auto`: bf16 on CUDA, fp32 elsewhere) and the activation
    settings; `batch_size` (samples this client trains per step, when known) says whether
    `--grad-accum-in-fp32` has several micro-batches to sum (unknown: assumed so).
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    precision = precision or Precision()
    config = config_from_dict(model_config)
    torch_device = device if isinstance(device, torch.device) else resolve_device(device)
    dtype = torch_dtype(precision.resolved(torch_device.type))
    seq_len = int(_read(llm_config, "max_seq_len"))
    optimizer = _read(llm_config, "optimizer")
    kind = _read(optimizer, "kind", "Dummy") if optimizer is not None else "Dummy"
    elem = torch.empty((), dtype=dtype).element_size()
    spec = parallel or ParallelSpec()
    meta = _meta_model(config)
    shapes = _shapes(meta)
    num_parameters = sum(math.prod(shape) for _, shape in shapes)
    weights = num_parameters * elem
    state = num_parameters * STATE_BYTES
    memory: list[tuple[str, int]] = [
        ("process baseline (python, torch, transformers)", process_baseline_bytes(torch_device)),
        ("parameters", weights),
        ("gradients", weights),
    ]
    several = batch_size is None or batch_size > micro_batch_size
    if precision.grad_accum_in_fp32 and elem != FP32 and several:
        memory.append(("fp32 gradient sums (--grad-accum-in-fp32)", num_parameters * FP32))
    result_size: int | None = None
    notes: list[str] = []
    if kind == "Distro":
        memory.append(("DisTrO momentum (fp32)", state))
        memory.append(("saved weights (lookahead undo)", weights))
        memory.append(("weights snapshot (early apply)", weights))
        result_size = result_bytes(shapes, optimizer)
    elif kind == "SparseLoCo":
        memory.append(("SparseLoCo error feedback (fp32)", state))
        memory.append(("AdamW moments (inner steps)", 2 * weights))
        memory.append(("AdamW moments snapshot (cancellation)", 2 * weights))
        memory.append(("saved weights and round start", 2 * weights))
        memory.append(("weights snapshot (early apply)", weights))
        result_size = result_bytes(shapes, optimizer)
    elif kind == "AdamW":
        memory.append(("AdamW moments", 2 * weights))
    if spec.enabled:
        if kind == "AdamW":
            raise ValueError("a multi-device client trains with DisTrO only")
        memory = memory[:1] + per_device_memory(meta, spec, elem, kind == "Distro")
    memory += held_results(result_size, num_clients)
    if result_size is not None:
        largest = max((math.prod(shape) for _, shape in shapes), default=0)
        memory.append(("DisTrO generate working memory (largest parameter)", largest * 2 * FP32))
        apply_working = largest * (24 + 2 * elem) // APPLY_RETAINED_SHARE
        memory.append(("DisTrO apply working memory (largest parameter)", apply_working))
    memory.append(
        (
            "activations (one micro-batch)",
            activation_bytes(config, micro_batch_size, seq_len, elem, precision),
        )
    )
    memory.append(
        ("logits and loss (one micro-batch)", logits_bytes(config, micro_batch_size, seq_len, elem))
    )
    return Estimate(
        device=str(torch_device),
        dtype=str(dtype).removeprefix("torch."),
        num_parameters=num_parameters,
        micro_batch_size=micro_batch_size,
        max_seq_len=seq_len,
        memory=memory,
        free_bytes=free_memory_bytes(torch_device),
        optimizer=str(optimizer) if optimizer is not None else "Dummy",
        distro_result_bytes=result_size,
        num_clients=num_clients,
        notes=notes,
        parallel=spec,
    )


def held_results(result_bytes: int | None, num_clients: int | None) -> list[tuple[str, int]]:
    """The results a client holds: its own encoded, every client's of two rounds."""
    if result_bytes is None:
        return []
    held = 2 * result_bytes * (num_clients or 1) + result_bytes
    return [("results held (own encoded, every client's for 2 rounds)", held)]
