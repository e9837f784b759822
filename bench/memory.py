"""Peak memory of a training client against `psyche-client check`'s estimate; prints one JSON
object on stdout.

For each `--dtype` a child process runs what a client's round pipeline does with the model, on
the CPU: load the run's model through `DistroBackend` (the flags' `Precision`), then per step
take the early-apply weights snapshot, apply the results of two steps back (`--clients`
results, decoded from bytes as received), train a batch of `--batch` samples of `--seq-len`
tokens in micro-batches of `--mbs`, encode the result and keep it and the peers' copies for
two rounds. The child reports its peak resident memory (`VmHWM` of /proc/self/status: the
kernel's high-water mark of the whole process, torch's allocations included). Identical
children peak up to ~15 % apart (the allocator's choices of when to return memory), and an
estimate is there to say whether the worst of them fits: each dtype runs `--repeats` children
(default 3) and is compared with the highest peak (`measured_peaks` lists them all). The parent
computes `estimate_run` for the same run (in a process that, like `check`, has imported torch
and transformers but built no model) and reports both and their ratio.

Usage: .venv/bin/python bench/memory.py [--model builtin:llama-20m] [--dtype fp32,bf16]
           [--seq-len 256] [--batch 8] [--mbs 4] [--clients 4] [--steps 3]
           [--repeats 3] [--grad-accum-in-fp32] [--activation-checkpointing]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def llm_config(args: argparse.Namespace) -> Any:
    from psyche_common.config import LLMConfig

    return LLMConfig.model_validate(
        {
            "max_seq_len": args.seq_len,
            "cold_start_warmup_steps": 0,
            "architecture": "HfLlama",
            "data_type": "Pretraining",
            "data_location": "Dummy",
            "checkpoint": {"Hub": {"repo_id": args.model, "revision": None}},
            "lr_schedule": {
                "Constant": {"base_lr": 4e-4, "warmup_init_lr": 0.0, "warmup_steps": 0}
            },
            "optimizer": {
                "Distro": {
                    "clip_grad_norm": 1.0,
                    "compression_decay": 0.999,
                    "compression_topk": 8,
                    "compression_chunk": 64,
                    "quantize_1bit": True,
                }
            },
        }
    )


class _Run:
    """The little of a coordinator `DistroBackend.load` reads."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def get_cold_start_warmup_bounds(self) -> None:
        return None


def peak_rss_bytes() -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def child(args: argparse.Namespace, dtype: str) -> dict[str, Any]:
    import numpy as np
    import torch
    from psyche_client.distro.result import DistroResult
    from psyche_client.training.distro_backend import DistroBackend
    from psyche_client.training.model.precision import Precision
    from psyche_common.batch_id import BatchId

    torch.manual_seed(0)
    precision = Precision(
        dtype=dtype,  # type: ignore[arg-type]
        grad_accum_in_fp32=args.grad_accum_in_fp32,
        activation_checkpointing=args.activation_checkpointing,
    )
    backend = DistroBackend.load(
        _Run(llm_config(args)), device="cpu", micro_batch_size=args.mbs, precision=precision
    )
    layout = backend.trainer.layout
    rng = np.random.default_rng(0)
    vocab = int(backend.info.config["vocab_size"])
    history: dict[int, list[DistroResult]] = {}
    losses = []
    for step in range(1, args.steps + 1):
        snapshot = backend.snapshot() if step - 2 in history else None
        if step - 2 in history:
            backend.apply(step, history.pop(step - 2))
        start = step * 1000
        batch = BatchId(start, start + args.batch - 1)
        tokens = rng.integers(0, vocab, (args.batch, args.seq_len))
        out = backend.train(step, batch, tokens, lambda: False)
        assert out is not None
        losses.append(out.loss)
        received = []
        for peer in range(args.clients):
            decoded = DistroResult.decode(out.payload, layout)
            peer_batch = BatchId(start + 100 * (peer + 1), start + 100 * (peer + 1) + 1)
            received.append(dataclasses.replace(decoded, batch_id=peer_batch))
        history[step] = received
        del snapshot
    return {
        "dtype": dtype,
        "peak_bytes": peak_rss_bytes(),
        "parameters": backend.info.num_parameters,
        "losses": losses,
    }


def estimate(args: argparse.Namespace, dtype: str) -> Any:
    import torch
    from psyche_client.tools.estimate import estimate_run
    from psyche_client.training.model.loading import load_model_config
    from psyche_client.training.model.precision import Precision

    precision = Precision(
        dtype=dtype,  # type: ignore[arg-type]
        grad_accum_in_fp32=args.grad_accum_in_fp32,
        activation_checkpointing=args.activation_checkpointing,
    )
    return estimate_run(
        llm_config(args),
        load_model_config(args.model),
        args.mbs,
        torch.device("cpu"),
        precision=precision,
        num_clients=args.clients,
        batch_size=args.batch,
    )


def measure(args: argparse.Namespace, dtype: str) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", dtype, *args.passthrough]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measuring {dtype} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="builtin:llama-20m")
    parser.add_argument("--dtype", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--mbs", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--repeats", type=int, default=3, help="children per dtype; the highest peak is compared"
    )
    parser.add_argument("--grad-accum-in-fp32", action="store_true")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the same measurement on builtin:llama-tiny with short samples (seconds; make test)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.seq_len, args.batch, args.mbs, args.steps = (
            "builtin:llama-tiny",
            32,
            2,
            1,
            1,
        )
        args.repeats = 1
    args.passthrough = [] if args.child else _without_dtype(argv)
    return args


def _without_dtype(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--dtype":
            skip = True
            continue
        if arg.startswith("--dtype="):
            continue
        out.append(arg)
    return out


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.child:
        print(json.dumps(child(args, args.child)))
        return 0
    rows = []
    for dtype in args.dtype.split(","):
        children = [measure(args, dtype) for _ in range(max(1, args.repeats))]
        peak = max(child["peak_bytes"] for child in children)
        predicted = estimate(args, dtype)
        rows.append(
            {
                "dtype": dtype,
                "parameters": children[0]["parameters"],
                "measured_peak_bytes": peak,
                "measured_peaks": [child["peak_bytes"] for child in children],
                "estimated_bytes": predicted.needed_bytes,
                "estimate_over_measured": round(predicted.needed_bytes / peak, 3),
                "estimate": dict(predicted.memory),
            }
        )
    setup = {
        k: v for k, v in vars(args).items() if k not in ("child", "passthrough", "dtype", "quick")
    }
    print(json.dumps({"benchmark": "memory", "quick": args.quick, "setup": setup, "runs": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
