"""Multi-device client benchmark: prints one JSON object.

Tokens/s of a 2-rank data-parallel client (`ParallelBackend`, replicated: this process is rank
0, its worker rank a process of its own) over a single-device client (`DistroBackend`) on the
same model, data and batches, each rank with one torch thread. A step is what a client does
with the model every round: train its batch (forward/backward, DisTrO generate, encode) and
apply the round's results (here its own). Both clients live in this process; their
measurement blocks alternate (1-rank, 2-rank, 1-rank, ...) so that the machine's load drift
hits both alike, and each figure is the median over the blocks. `--fsdp` adds a second phase
that times the sharded mode against the same single-device client (`ratio_sharded_2_over_1`);
a process holds one torch.distributed world at a time, so the phases run one after the other.

The ratio can reach 2 only when two cores are free for the two ranks: the JSON carries the
machine's core count and load averages (`os.getloadavg()`) before and after.

`--quick` (what `make test` runs): the tiny preset (`builtin:llama-tiny`), one block of one
step of 4 × 32 tokens per client: both backends and their worker rank, in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one torch thread per rank (inherited by workers)

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from psyche_common.coordinator import Coordinator

MODEL = "builtin:llama-2m"
QUICK_MODEL = "builtin:llama-tiny"


def progress(message: str) -> None:
    print(f"[bench/parallel] {message}", file=sys.stderr, flush=True)


def coordinator(model: str, seq_len: int) -> Coordinator:
    """A coordinator of a DisTrO run of `model` (what the backends load for)."""
    from bench.support.run_configs import distro_model, make_coordinator

    # the backends read only the run's model and its cold-start bounds (none in this run)
    return make_coordinator(distro_model(model, chunk=64, topk=8, max_seq_len=seq_len))


def batches(args: argparse.Namespace) -> list[np.ndarray]:
    """The run's samples: the builtin corpus, the same for both clients."""
    from psyche_common.batch_id import BatchId
    from psyche_common.data.builtin import BuiltinDataProvider

    provider = BuiltinDataProvider("python-stdlib", args.seq_len, None)
    count = args.steps * args.blocks + 1
    return [
        provider.read(BatchId(i * args.batch, (i + 1) * args.batch - 1)).astype(np.int64)
        for i in range(count)
    ]


class Client:
    """A backend and the step counter it has reached."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.step = 0

    def run(self, data: list[np.ndarray]) -> float:
        """Train and apply one step per batch; returns the seconds taken."""
        from psyche_common.batch_id import BatchId

        started = time.perf_counter()
        for tokens in data:
            self.step += 1
            batch = BatchId(self.step * len(tokens), (self.step + 1) * len(tokens) - 1)
            out = self.backend.train(self.step, batch, tokens, lambda: False)
            result = self.backend.decode(self.step, batch, out.payload, out.data_hash)
            self.backend.apply(self.step, [result])
        return time.perf_counter() - started


def measure(
    clients: dict[str, Client], data: list[np.ndarray], args: argparse.Namespace
) -> dict[str, Any]:
    tokens_per_block = args.steps * args.batch * args.seq_len
    for client in clients.values():
        client.run(data[:1])  # first step: allocations, caches
    rates: dict[str, list[float]] = {name: [] for name in clients}
    for block in range(args.blocks):
        chunk = data[1 + block * args.steps : 1 + (block + 1) * args.steps]
        for name, client in clients.items():
            seconds = client.run(chunk)
            rates[name].append(tokens_per_block / seconds)
            progress(f"block {block}: {name} {rates[name][-1]:.0f} tokens/s")
    return {name: statistics.median(values) for name, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=None, help="samples per batch (32)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sample (128)")
    parser.add_argument("--micro-batch", type=int, default=None, help="micro-batch size (8)")
    parser.add_argument("--steps", type=int, default=None, help="steps per measurement block (3)")
    parser.add_argument("--blocks", type=int, default=None, help="alternating blocks (3)")
    parser.add_argument("--fsdp", action="store_true", help="also time the sharded mode")
    parser.add_argument("--quick", action="store_true", help="tiny model, one short block")
    args = parser.parse_args()
    quick = args.quick
    model = QUICK_MODEL if quick else MODEL
    args.batch = args.batch or (4 if quick else 32)
    args.seq_len = args.seq_len or (32 if quick else 128)
    args.micro_batch = args.micro_batch or (2 if quick else 8)
    args.steps = args.steps or (1 if quick else 3)
    args.blocks = args.blocks or (1 if quick else 3)
    torch.set_num_threads(1)

    from psyche_client.training.distro_backend import DistroBackend
    from psyche_client.training.parallel.backend import ParallelBackend
    from psyche_client.training.parallel.plan import ParallelSpec

    load_before = os.getloadavg()
    setup = coordinator(model, args.seq_len)
    data = batches(args)
    single = Client(DistroBackend.load(setup, device="cpu", micro_batch_size=args.micro_batch))
    rates: dict[str, float] = {}
    ratios: dict[str, float] = {}
    for name, fsdp in [("2_ranks", False)] + ([("2_ranks_sharded", True)] if args.fsdp else []):
        progress(f"phase {name}: starting the 2-rank client")
        backend = ParallelBackend.load(
            setup, spec=ParallelSpec(2, fsdp), device="cpu", micro_batch_size=args.micro_batch
        )
        try:
            phase = measure({"1_rank": single, name: Client(backend)}, data, args)
        finally:
            backend.close()  # one torch.distributed world per process at a time
        rates[name] = phase[name]
        rates[f"1_rank_next_to_{name}"] = phase["1_rank"]
        ratios[name] = phase[name] / phase["1_rank"]
    result: dict[str, Any] = {
        "benchmark": "parallel",
        "model": model,
        "quick": quick,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "steps_per_block": args.steps,
        "blocks": args.blocks,
        "torch_threads_per_rank": 1,
        "tokens_per_sec": {name: round(rate, 1) for name, rate in rates.items()},
        "ratio_2_over_1": round(ratios["2_ranks"], 3),
        "cpu_count": os.cpu_count(),
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
    }
    if args.fsdp:
        result["ratio_sharded_2_over_1"] = round(ratios["2_ranks_sharded"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
