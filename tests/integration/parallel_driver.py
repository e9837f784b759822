"""Rank 0 of a multi-device client next to a single-device client, in a process of its own.

`python -m tests.integration.parallel_driver --ranks 2 [--fsdp] [--device cuda] ...` loads a
`ParallelBackend` (which starts its worker ranks) and a `DistroBackend` on the same model
(on the CPU by default; with `--device cuda` rank r uses GPU r over NCCL and the single-device
client GPU 0), trains both on the same batches, applies the same results to both, and prints
one JSON object with what the tests check: losses, how far the two clients' DisTrO results
agree (top-k indices and signs), weights hashes, a cancelled step, parameter export, a
checkpoint and loading peer parameters. The last step's batch has one sample, so every rank
but rank 0 has an empty share. The steps skip step 3, as a client does that verifies a round
(no lookahead at step 4). It runs in its own process so that a failing rank can never take
the test runner down.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
from psyche_client.distro import DistroResult, ResultLayout
from psyche_client.training.distro_backend import DistroBackend
from psyche_client.training.model.numerics import torch_dtype
from psyche_client.training.model.precision import Precision
from psyche_client.training.parallel.backend import ParallelBackend
from psyche_client.training.parallel.plan import ParallelSpec
from psyche_client.training.trainer import weights_digest
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import Coordinator, RunState

from tests.support.coordinators import coordinator_in, distro_model, ids


def coordinator(model: str, chunk: int, topk: int, values: str) -> Coordinator:
    """The Warmup (where backends load) of a DisTrO run of `model`, 32-token sequences, its
    values in the value format `values`."""
    llm = distro_model(model, chunk=chunk, topk=topk, max_seq_len=32)
    distro = llm["optimizer"]["Distro"]
    del distro["quantize_1bit"]
    distro["value_format"] = values
    return coordinator_in(RunState.Warmup, ids(2), model=llm)


def agreement(a: DistroResult, b: DistroResult, layout: ResultLayout) -> dict[str, float]:
    """Share of b's top-k coefficients (per chunk, as sets) that a chose too, the share of
    those whose sign is the same in both, and the largest relative difference of their values
    (0 with 1-bit values)."""
    chosen = shared = same_sign = 0
    worst = 0.0
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        ia, ib = ta.indices(), tb.indices()
        va, vb = (t.values(layout.value_kind) for t in (ta, tb))
        for chunk in range(ia.shape[0]):
            values_a = dict(zip(ia[chunk].tolist(), va[chunk].tolist(), strict=True))
            values_b = dict(zip(ib[chunk].tolist(), vb[chunk].tolist(), strict=True))
            common = values_a.keys() & values_b.keys()
            chosen += len(values_b)
            shared += len(common)
            for k in common:
                same_sign += np.sign(values_a[k]) == np.sign(values_b[k])
                scale = max(abs(values_a[k]), abs(values_b[k]), 1e-30)
                worst = max(worst, abs(values_a[k] - values_b[k]) / scale)
    return {"indices": shared / chosen, "signs": int(same_sign) / max(shared, 1), "values": worst}


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    values = "bf16" if args.bf16_values else args.value_format
    setup = coordinator(args.model, args.chunk, args.topk, values)
    spec = ParallelSpec(args.ranks, args.fsdp)
    precision = Precision(dtype=args.dtype)
    parallel = ParallelBackend.load(
        setup,
        spec=spec,
        device=args.device,
        micro_batch_size=args.mbs,
        timeout=args.timeout,
        precision=precision,
    )
    time.sleep(args.idle)  # longer than the timeout: only heartbeats keep the workers waiting
    single = DistroBackend.load(
        setup, device=args.device, micro_batch_size=args.mbs, precision=precision
    )
    report: dict[str, Any] = {
        "initial": [parallel.weights_hash().hex(), single.weights_hash().hex()]
    }
    rng = np.random.default_rng(args.seed)
    steps = []
    for index in range(1, args.steps + 1):
        # step 3 is skipped (a verifier round): step 4 trains without the lookahead
        step = index if index < 3 else index + 1
        size = args.batch if index < args.steps else 1  # the last batch leaves rank 1 idle
        batch = BatchId(step * 100, step * 100 + size - 1)
        tokens = rng.integers(0, 256, (size, args.seq_len))
        out_p = parallel.train(step, batch, tokens, lambda: False)
        out_s = single.train(step, batch, tokens, lambda: False)
        assert out_p is not None and out_s is not None
        result_p = single.decode(step, batch, out_p.payload, out_p.data_hash)
        result_s = single.decode(step, batch, out_s.payload, out_s.data_hash)
        parallel.apply(
            step, [parallel.decode(step, batch, o.payload, o.data_hash) for o in (out_p, out_s)]
        )
        single.apply(step, [result_p, result_s])
        steps.append(
            {
                "loss": [out_p.loss, out_s.loss],
                "agreement": agreement(result_p, result_s, single.trainer.layout),
                "same_bytes": out_p.payload == out_s.payload,
                "sizes": [len(out_p.payload), len(out_s.payload)],
                "tokens": out_p.tokens,
                "hashes": [parallel.weights_hash().hex(), single.weights_hash().hex()],
            }
        )
    report["steps"] = steps
    report["cancel"] = cancelled_step(parallel, args)
    exported = parallel.export_parameters()
    report["export_equal"] = exported == single.export_parameters()
    with tempfile.TemporaryDirectory() as directory:
        parallel.save_checkpoint(directory)
        from transformers import AutoModelForCausalLM

        saved = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch_dtype(precision.resolved("cpu"))
        )
        report["checkpoint_hash"] = weights_digest(saved).hex()
    fresh = DistroBackend.load(
        setup, device=args.device, micro_batch_size=args.mbs, precision=precision
    )
    parallel.load_parameters({name: data for name, _, _, data in fresh.export_parameters()})
    report["loaded"] = [parallel.weights_hash().hex(), fresh.weights_hash().hex()]
    report["storage"] = storage(parallel)
    report["tied"] = tied(parallel)
    parallel.close()
    return report


def cancelled_step(parallel: ParallelBackend, args: argparse.Namespace) -> dict[str, Any]:
    """Cancel after the first micro-batch slot: nothing changes, and the ranks stay in step."""
    before = parallel.weights_hash().hex()
    asked = []

    def cancel_after_first() -> bool:
        asked.append(1)
        return len(asked) > 1

    tokens = np.zeros((args.batch, args.seq_len), dtype=np.int64)
    batch = BatchId(10_000, 10_000 + args.batch - 1)
    out = parallel.train(99, batch, tokens, cancel_after_first)
    after = parallel.train(100, batch, tokens, lambda: False)
    return {
        "returned_none": out is None,
        "hash_unchanged": parallel.weights_hash().hex() == before,
        "next_step_trained": after is not None and bool(np.isfinite(after.loss)),
    }


def storage(parallel: ParallelBackend) -> dict[str, int]:
    """Parameter elements rank 0 holds: its shards and its owned full copies (sharded mode),
    or its replica."""
    engine: Any = parallel.engine
    model = getattr(engine, "model", None)
    if model is not None and hasattr(model, "masters"):
        return {
            "total": sum(torch.Size(s).numel() for s in model.shapes.values()),
            "shards": sum(model.local(p).numel() for _, p in model.params),
            "owned_copies": sum(m.numel() for m in model.masters.values()),
        }
    return {"total": sum(p.numel() for p in engine.trainer.model.parameters())}


def tied(parallel: ParallelBackend) -> bool:
    """Whether rank 0's model (the sharded module, or the replica) shares one tensor between
    its input and output embeddings."""
    engine: Any = parallel.engine
    sharded = getattr(engine, "model", None)
    model = sharded.module if sharded is not None else engine.trainer.model
    output = model.get_output_embeddings()
    return output is not None and output.weight is model.get_input_embeddings().weight


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--model", default="builtin:llama-tiny")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--mbs", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=16)
    parser.add_argument("--topk", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="--parallel-timeout")
    parser.add_argument("--idle", type=float, default=0.0, help="seconds to idle after loading")
    parser.add_argument("--bf16-values", action="store_true", help="send bf16 values, not signs")
    parser.add_argument("--value-format", default="1-bit", help="the Distro table's value_format")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="--dtype")
    parser.add_argument("--device", default="cpu", help="--device: cpu, or cuda (rank r on GPU r)")
    args = parser.parse_args()
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
