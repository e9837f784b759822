"""DisTrO cost and quality benchmark; prints exactly one JSON object on stdout.

Default run:
1. Bytes per client per step for the ~20M-parameter preset (`builtin:llama-20m`, chunk 64,
   top-k 8, 1-bit) against a dense bf16 and fp32 gradient of the same model
   (`ratio_vs_bf16`, `ratio_vs_fp32`: dense bytes / encoded result bytes).
2. Encode (clip + momentum + DCT + top-k + packing + serialisation) time, and decode (strict
   decode of N results) + apply (aggregation, inverse DCT, sign step) time for N = 4, 16 and
   64 results, each as a fraction of the same client's forward+backward time, all measured in
   this run (medians). The first 4 results come from real training steps; the others are
   built directly with distinct random indices and random values per chunk (decode and apply
   cost does not depend on the values).
3. DisTrO / AdamW validation loss at equal tokens from a short convergence run of the
   prototype model (4 simulated peers, pipeline with the two-round delay).

`--study`: instead, the optimizer study of issue 22 (bench/study/study_protocol.py: the
protocol, its size and its measured timing; study_runner.py: the stages): a learning-rate
sweep of AdamW, DisTrO and SparseLoCo on one seed, the winners on 3 fresh seeds at 4 and 16
peers, the synchronous and DiLoCo diagnostics (DiLoCo's outer lr swept first); prints
`{"protocol", "sweep", "study", "frontier", "best_at_146", "best_at_600", "goals"}`.
`--jobs N` runs N runs at once (one process and one torch thread each; 2 on a 2-core
machine), `--cache FILE` keeps finished runs (JSON lines), `--no-diagnostics` leaves the
synchronous and DiLoCo runs out, `--steps N` changes the run length, `--variants` adds the
variant candidates (`VARIANT_CANDIDATES`: SparseLoCo as Templar runs it, with the 2-bit
codebook or 4-bit values, at outer lr 0.5 and 2, top-128; DisTrO top-32, with weight decay,
with momentum on the applied aggregate), each swept and then run on the fresh seeds at 4
peers. With `--quick` the same code path on a model and run of seconds (its numbers mean
nothing). `python -m bench.study.study_report FILE` renders a saved study as the tables of
docs/distro.md.
Both studies train on the CPU whatever `--device` says.

`--variants-study`: the earlier 300-step study of docs/distro.md (bench/study/distro_study.py):
Psyche's settings against variants, `--steps` steps (300 in the docs) on seeds `--seeds`, each
row's validation loss over AdamW's and bytes per token; prints `{"study": [...], "best": NAME,
...}`. It runs for hours on a 2-core CPU; `--cache FILE` keeps finished runs.

`--build-134m DIR` writes the ~134M-parameter Llama of docs/benchmarks.md (hidden 768, 12
layers, vocabulary 32,000, untied; `bench/support/models.py`) into DIR as a config-only
Hugging Face directory and measures that model (as `--model DIR`).

`--quick` (what `make test` runs): the default run at its smallest, in seconds: the tiny preset
(`builtin:llama-tiny`), one timed round of 2 × 64-token sequences per peer, and a 3-step
convergence run of 4 × 64-token batches judged on 8 held-out windows. Its figures say nothing
about the 20M model or about convergence.

`--device cuda` (default cpu) measures part 2 on the GPU, in the client's default dtype there
(bf16; `--dtype` chooses another) with TF32 matmuls, waiting for the GPU before each clock
reading; part 1 does not depend on the device and part 3 always runs on the CPU.

Usage: .venv/bin/python bench/distro.py [--steps N] [--timing-iters N] [--quick] [--device D]
       .venv/bin/python bench/distro.py --build-134m DIR [--timing-iters N] [--steps N]
       .venv/bin/python bench/distro.py --study [--quick] [--jobs 2] [--cache FILE]
                                        [--no-diagnostics] [--steps N] [--variants]
       .venv/bin/python bench/distro.py --variants-study [--steps 300] [--seeds 0,1]
                                        [--cache FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from psyche_client.distro import DistroResult, DistroSettings
from psyche_client.distro.compress import pack_indices
from psyche_client.distro.result import TensorPayload
from psyche_client.distro.values import quantize
from psyche_client.training.model.device import resolve_device
from psyche_client.training.model.loading import count_parameters, load_model
from psyche_client.training.model.numerics import enable_tf32, model_dtype
from psyche_client.training.model.precision import DTYPE_NAMES, DtypeName, Precision
from psyche_client.training.trainer import Trainer
from psyche_common.batch_id import BatchId

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.study.distro_study import VARIANTS, run_study  # noqa: E402
from bench.study.simulation import (  # noqa: E402
    load_stdlib_corpus,
    run_adamw,
    run_distro,
)
from bench.study.study_protocol import (  # noqa: E402
    PROTOCOL,
    QUICK_PROTOCOL,
    VARIANT_CANDIDATES,
)
from bench.study.study_runner import run_protocol  # noqa: E402
from bench.support.models import write_llama_134m  # noqa: E402 - needs ROOT on sys.path

SETTINGS = DistroSettings(
    compression_decay=0.999,
    compression_topk=8,
    compression_chunk=64,
    quantize_1bit=True,
    clip_grad_norm=1.0,
)
PEERS = 4
RESULT_COUNTS = (4, 16, 64)
CONVERGENCE_BATCH = 8  # sequences per step, split over the peers
CONVERGENCE_SEQ_LEN = 256
CONVERGENCE_VALID_WINDOWS = 128  # held-out windows of CONVERGENCE_SEQ_LEN tokens


def _train_steps(trainer: Trainer, iters: int, batch: int, seq_len: int) -> dict[str, object]:
    """`iters` + 1 rounds of `PEERS` training steps; the first round is warm-up."""
    vocab = trainer.model.config.vocab_size
    rng = np.random.default_rng(0)
    fwd_bwd, encode, blobs = [], [], []
    for step in range(1, iters + 2):
        blobs = []
        for peer in range(PEERS):
            tokens = rng.integers(0, vocab, size=(batch, seq_len), dtype=np.int64)
            first = (step * PEERS + peer) * batch
            out = trainer.train(BatchId(first, first + batch - 1), tokens, step, 1e-4, 1e-4)
            assert out.result is not None
            t0 = time.perf_counter()
            blob = out.result.encode()
            serialise = time.perf_counter() - t0
            if step > 1:  # the first round warms up allocators and caches
                fwd_bwd.append(out.forward_backward_seconds)
                encode.append(out.optimizer_seconds + serialise)
            blobs.append(blob)
        trainer.apply([trainer.decode_result(blob) for blob in blobs], step, 1e-4)
    return {"fwd_bwd": fwd_bwd, "encode": encode, "blobs": blobs, "result": out.result}


def _more_results(trainer: Trainer, count: int, first_batch: int) -> list[bytes]:
    """Valid results built directly: per chunk k distinct random indices and random signs
    (decode and apply cost does not depend on the values; distinct random indices are the
    most coefficients a set of results can bring, so this is the dearest case)."""
    layout = trainer.layout
    rng = np.random.default_rng(1)
    blobs = []
    for i in range(count):
        tensors = []
        for t in layout.tensors:
            idx = rng.integers(0, t.totalk, size=(t.chunks, t.k))
            while t.k > 1:  # redraw the chunks that picked an index twice
                ordered = np.sort(idx, axis=1)
                again = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
                if not again.any():
                    break
                idx[again] = rng.integers(0, t.totalk, size=(int(again.sum()), t.k))
            values = torch.from_numpy(rng.standard_normal(t.chunks * t.k).astype(np.float32))
            packed, _ = quantize(values.view(t.chunks, t.k), layout.value_kind)
            tensors.append(
                TensorPayload(
                    t.xshape, t.totalk, t.k, pack_indices(torch.from_numpy(idx), t.totalk), packed
                )
            )
        start = first_batch + 4 * i
        result = DistroResult(99, BatchId(start, start + 3), i, layout.value_kind, tuple(tensors))
        blobs.append(result.encode())
    return blobs


def _wait(device: torch.device) -> None:
    """Wait for the kernels queued on a CUDA device before reading the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_model(
    name: str,
    iters: int,
    batch: int,
    seq_len: int,
    device_spec: str = "cpu",
    dtype: DtypeName = "auto",
) -> dict[str, object]:
    device = resolve_device(device_spec)
    precision = Precision(dtype=dtype)
    model, _ = load_model(name, device=device, dtype=model_dtype(precision, device))
    enable_tf32(device)  # as the client does
    trainer = Trainer(model, SETTINGS, device=device, micro_batch_size=batch)
    params = count_parameters(trainer.model)
    trained = _train_steps(trainer, iters, batch, seq_len)
    blobs = trained["blobs"] + _more_results(trainer, max(RESULT_COUNTS) - PEERS, 10**6)
    decode_apply: dict[str, float] = {}
    for count in RESULT_COUNTS:
        times = []
        for rep in range(iters + 1):
            t0 = time.perf_counter()
            results = [trainer.decode_result(blob) for blob in blobs[:count]]
            trainer.apply(results, 100 + rep, 1e-4)
            _wait(device)
            if rep:  # the first pass warms up
                times.append(time.perf_counter() - t0)
        decode_apply[str(count)] = statistics.median(times)
    fwd_bwd_s = statistics.median(trained["fwd_bwd"])
    encode_s = statistics.median(trained["encode"])
    result = trained["result"]
    blob_size = len(trained["blobs"][0])
    return {
        "model": name,
        "device": str(device),
        "dtype": precision.resolved(device.type),
        "parameters": params,
        "tokens_per_client_step": batch * seq_len,
        "payload_bytes": result.payload_bytes(),
        "result_bytes": blob_size,
        "dense_bf16_bytes": 2 * params,
        "dense_fp32_bytes": 4 * params,
        "ratio_vs_bf16": 2 * params / blob_size,
        "ratio_vs_fp32": 4 * params / blob_size,
        "forward_backward_ms": 1000 * fwd_bwd_s,
        "encode_ms": 1000 * encode_s,
        "encode_fraction_of_forward_backward": encode_s / fwd_bwd_s,
        "decode_apply_ms_by_results": {n: 1000 * s for n, s in decode_apply.items()},
        "decode_apply_fraction_by_results": {n: s / fwd_bwd_s for n, s in decode_apply.items()},
        "decode_apply_64_over_4": decode_apply["64"] / decode_apply["4"],
    }


def measure_convergence(
    steps: int,
    batch: int = CONVERGENCE_BATCH,
    seq_len: int = CONVERGENCE_SEQ_LEN,
    valid_windows: int = CONVERGENCE_VALID_WINDOWS,
) -> dict[str, float]:
    corpus = load_stdlib_corpus()
    shape = {"batch": batch, "seq_len": seq_len, "valid_windows": valid_windows}
    adamw = run_adamw(corpus, steps, lr=1e-3, **shape)
    distro = run_distro(corpus, steps, lr=3e-3, peers=PEERS, **shape)
    if not distro.replicas_identical:
        raise SystemExit("DisTrO replicas diverged during the convergence run")
    return {
        "steps": steps,
        "tokens": steps * batch * seq_len,
        "initial_val_loss": adamw.initial_val,
        "adamw_val_loss": adamw.final_val,
        "distro_val_loss": distro.final_val,
        "distro_payload_bytes_per_peer_step": distro.payload_bytes_per_peer,
    }


def run_optimizer_study(
    quick: bool,
    jobs: int,
    cache: Path | None,
    diagnostics: bool,
    steps: int | None,
    variants: bool,
) -> None:
    """`--study`: the protocol (or its quick form) run and printed as one JSON object."""
    protocol = QUICK_PROTOCOL if quick else PROTOCOL
    if steps is not None:
        protocol = dataclasses.replace(protocol, steps=steps)
    if variants and not quick:
        protocol = dataclasses.replace(
            protocol, candidates=protocol.candidates + VARIANT_CANDIDATES
        )
    if not diagnostics:
        protocol = dataclasses.replace(protocol, synchronous_diagnostic=False, diloco=None)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    started = time.perf_counter()
    report = run_protocol(
        protocol,
        jobs=jobs,
        cache=cache,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(
        json.dumps(
            {
                "benchmark": "distro-study",
                "quick": quick,
                **report,
                "jobs": jobs,
                "seconds": time.perf_counter() - started,
                "load_average": {"before": load_before, "after": os.getloadavg()},
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="convergence run length")
    parser.add_argument("--timing-iters", type=int, default=None, help="timed rounds (x4 peers)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per client step")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    parser.add_argument("--model", default=None, help="model for sizes and times")
    parser.add_argument("--quick", action="store_true", help="the smallest default run (seconds)")
    parser.add_argument(
        "--build-134m", type=Path, default=None, help="write the 134M Llama here and measure it"
    )
    parser.add_argument(
        "--device", default="cpu", help="where the model trains: cpu, cuda or cuda:N (cpu)"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_NAMES,
        help="parameter dtype as the client's --dtype (auto: fp32 on the CPU, bf16 on CUDA)",
    )
    parser.add_argument("--study", action="store_true", help="run the optimizer study instead")
    parser.add_argument("--jobs", type=int, default=1, help="study runs at once")
    parser.add_argument(
        "--no-diagnostics", action="store_true", help="study without synchronous/DiLoCo runs"
    )
    parser.add_argument(
        "--variants", action="store_true", help="study: add the variant candidates too"
    )
    parser.add_argument(
        "--variants-study", action="store_true", help="run the 300-step variant study instead"
    )
    parser.add_argument("--seeds", default="0,1", help="variant study seeds, comma-separated")
    parser.add_argument("--only", default=None, help="study variants to run, comma-separated")
    parser.add_argument("--cache", type=Path, default=None, help="study run cache (JSON lines)")
    args = parser.parse_args()
    if args.study:
        run_optimizer_study(
            args.quick, args.jobs, args.cache, not args.no_diagnostics, args.steps, args.variants
        )
        return
    quick = args.quick and not args.variants_study
    model = args.model or ("builtin:llama-tiny" if quick else "builtin:llama-20m")
    timing_iters = args.timing_iters or (1 if quick else 2)
    batch = args.batch or (2 if quick else 4)
    seq_len = args.seq_len or (64 if quick else 256)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    if args.variants_study:
        names = set(args.only.split(",")) if args.only else None
        variants = [v for v in VARIANTS if names is None or v.name in names]
        report = run_study(
            args.steps or 300,
            [int(s) for s in args.seeds.split(",")],
            variants,
            cache=args.cache,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
        report["load_average"] = {"before": load_before, "after": os.getloadavg()}
        print(json.dumps(report))
        return
    if args.build_134m is not None:
        model = str(write_llama_134m(args.build_134m))
    print(f"measuring {model}...", file=sys.stderr)
    sizes = measure_model(model, timing_iters, batch, seq_len, args.device, args.dtype)
    steps = args.steps or (3 if quick else 80)
    print(f"convergence run, {steps} steps...", file=sys.stderr)
    convergence = (
        measure_convergence(steps, batch=PEERS, seq_len=64, valid_windows=8)
        if quick
        else measure_convergence(steps)
    )
    report = {
        "benchmark": "distro",
        "quick": quick,
        "config": {
            "chunk": SETTINGS.compression_chunk,
            "topk": SETTINGS.compression_topk,
            "quantize_1bit": SETTINGS.quantize_1bit,
            "peers": PEERS,
        },
        **sizes,
        "convergence": convergence,
        "distro_over_adamw_loss_ratio": convergence["distro_val_loss"]
        / convergence["adamw_val_loss"],
        "torch_threads": torch.get_num_threads(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
