"""DisTrO cost and quality benchmark; prints exactly one JSON object on stdout.

1. Bytes per client per step for the ~20M-parameter preset (`builtin:llama-20m`, chunk 64,
   top-k 8, 1-bit) against a dense bf16 and fp32 gradient of the same model
   (`ratio_vs_bf16`, `ratio_vs_fp32`: dense bytes / encoded result bytes).
2. Encode (clip + momentum + DCT + top-k + packing + serialisation) and decode (strict
   decode of 4 peers' results + scatter-mean + inverse DCT + sign step) time, each as a
   fraction of the same client's forward+backward time, all measured in this run.
3. DisTrO / AdamW validation loss at equal tokens from a short convergence run of the
   prototype model (4 simulated peers, pipeline with the two-round delay).

Usage: .venv/bin/python bench/distro.py [--steps N] [--timing-iters N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from psyche_client.distro import DistroSettings
from psyche_client.model.loading import count_parameters, load_model
from psyche_client.training.trainer import Trainer
from psyche_common.assignment import BatchId

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.simulation import (  # noqa: E402 - needs the repo root on sys.path
    load_stdlib_corpus,
    run_adamw,
    run_distro,
)

SETTINGS = DistroSettings(
    compression_decay=0.999,
    compression_topk=8,
    compression_chunk=64,
    quantize_1bit=True,
    clip_grad_norm=1.0,
)
PEERS = 4
CONVERGENCE_BATCH = 8  # sequences per step, split over the peers
CONVERGENCE_SEQ_LEN = 256


def measure_20m(iters: int, batch: int, seq_len: int) -> dict[str, object]:
    model, _ = load_model("builtin:llama-20m", device="cpu", dtype=torch.float32)
    trainer = Trainer(model, SETTINGS, device="cpu", micro_batch_size=batch)
    params = count_parameters(trainer.model)
    vocab = trainer.model.config.vocab_size
    rng = np.random.default_rng(0)
    fwd_bwd, encode, decode = [], [], []
    blob_size = payload = 0
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
            if step > 1:  # the first step warms up allocators and caches
                fwd_bwd.append(out.forward_backward_seconds)
                encode.append(out.optimizer_seconds + serialise)
            blobs.append(blob)
            blob_size, payload = len(blob), out.result.payload_bytes()
        t0 = time.perf_counter()
        results = [trainer.decode_result(blob) for blob in blobs]
        trainer.apply(results, step, 1e-4)
        if step > 1:
            decode.append(time.perf_counter() - t0)
    fwd_bwd_s = statistics.median(fwd_bwd)
    encode_s = statistics.median(encode)
    decode_s = statistics.median(decode)
    return {
        "model": "builtin:llama-20m",
        "parameters": params,
        "tokens_per_client_step": batch * seq_len,
        "payload_bytes": payload,
        "result_bytes": blob_size,
        "dense_bf16_bytes": 2 * params,
        "dense_fp32_bytes": 4 * params,
        "ratio_vs_bf16": 2 * params / blob_size,
        "ratio_vs_fp32": 4 * params / blob_size,
        "forward_backward_ms": 1000 * fwd_bwd_s,
        "encode_ms": 1000 * encode_s,
        "decode_apply_ms_4_results": 1000 * decode_s,
        "encode_fraction_of_forward_backward": encode_s / fwd_bwd_s,
        "decode_fraction_of_forward_backward": decode_s / fwd_bwd_s,
    }


def measure_convergence(steps: int) -> dict[str, float]:
    corpus = load_stdlib_corpus()
    shape = {"batch": CONVERGENCE_BATCH, "seq_len": CONVERGENCE_SEQ_LEN}
    adamw = run_adamw(corpus, steps, lr=1e-3, **shape)
    distro = run_distro(corpus, steps, lr=3e-3, peers=PEERS, **shape)
    if not distro.replicas_identical:
        raise SystemExit("DisTrO replicas diverged during the convergence run")
    return {
        "steps": steps,
        "tokens": steps * CONVERGENCE_BATCH * CONVERGENCE_SEQ_LEN,
        "initial_val_loss": adamw.initial_val,
        "adamw_val_loss": adamw.final_val,
        "distro_val_loss": distro.final_val,
        "distro_payload_bytes_per_peer_step": distro.payload_bytes_per_peer,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="convergence run length")
    parser.add_argument("--timing-iters", type=int, default=2, help="timed steps (x4 peers)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per client step")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sequence")
    args = parser.parse_args()
    torch.manual_seed(0)
    print("measuring the 20M model...", file=sys.stderr)
    sizes = measure_20m(args.timing_iters, args.batch, args.seq_len)
    print(f"convergence run, {args.steps} steps...", file=sys.stderr)
    convergence = measure_convergence(args.steps)
    report = {
        "benchmark": "distro",
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
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
