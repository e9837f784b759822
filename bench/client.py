"""Client benchmark: prints one JSON object.

1. Training throughput: tokens/s of one client in a 1-client run (a real `psyche-server`
   process, an in-process `ClientApp`, DisTrO, CPU) vs the same model, data, batch and
   micro-batches trained by a bare PyTorch loop (forward/backward, clipping, AdamW). The
   machine is shared and its load drifts by 2x within minutes, so the bare loop runs in a
   separate process *at the same time* as the client run, each side with the same number of
   torch threads (default 1), and its tokens/s is taken over its steps inside the client's
   measured window. The client figure is wall-clock over the steady rounds (the first two are
   skipped: model load, first apply), from the start of the first to the start of the round
   after the last, so it includes everything a run costs: apply, data fetch, DisTrO
   generate/encode/decode, waiting for states, the witness phase. The reported ratio is the
   median over `--repeats` client runs.

   Two step lengths are measured: the long step (batch 64, several seconds of compute on
   this CPU) and a short one (batch 10, about half a second on a quiet machine;
   `--short-batch`). The round protocol adds a RoundWitness phase (`round_witness_time`,
   0.2 s as in the shipped configs, millisecond-exact; `--round-witness-time` sets another,
   e.g. 1 to see the whole-second floor a Psyche config puts under every round); the client
   trains the next round's batches during it (the round is prepared while the witnesses
   report), so what remains per round is the apply, decoding, the Finished/witness exchange
   and the tick latency, and the window itself when a step is shorter than it.

   Every round is broken down (medians over rounds) from timers wrapped around the client's
   own calls, over the window from the start of a round's training to the start of the next
   one's: apply of round h-2, data fetch, forward/backward, DisTrO generate (clip +
   momentum + DCT + top-k), encode + commitment, decode of results, weights hashing, the
   training itself and the idle time after it, and the RoundWitness phase.
   `--model M` measures another model on both sides (a local directory too); `--build-134m
   DIR` writes the ~134M-parameter Llama of docs/benchmarks.md there first
   (`bench/support/models.py`).
   For it, `--batch 32 --short-batch 4 --micro-batch 4` gives the 8,192- and 1,024-token steps.
2. Late-joiner model fetch: seconds to fetch a ~20M-parameter model's bytes peer-to-peer
   (`psyche_client.p2p.benchmark`, 3 serving peers, hash-checked parameters) vs a raw
   loopback socket copy of the same bytes.

`--evals`: the long step is measured twice, without and with evals during training (the
client evaluates a tiny local multiple-choice task with lm-eval, all its documents, and the
held-out loss every step, whenever it would otherwise wait): "client ÷ bare" should not move
beyond the noise. `evals_completed` says how many evals finished in the measured runs.

`--device cuda` (default cpu): the client and the bare loop both train on the GPU, each in
the client's default dtype there (bf16; fp32 on the CPU), with TF32 matmuls; they share the
GPU as they share the CPU otherwise, so each runs slower than it would alone.

`--quick` (what `make test` runs): both parts at their smallest, in seconds: the tiny preset
(`builtin:llama-tiny`), one client run of 6 steps of 4 × 32 tokens next to the bare loop (the
long step only), and the fetch of the tiny preset's bytes. Its ratios mean nothing: the
rounds are all protocol.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support.models import write_llama_134m  # noqa: E402 - needs ROOT on sys.path

MODEL = "builtin:llama-2m"
QUICK_MODEL = "builtin:llama-tiny"
FETCH_PRESET = "llama-20m"
QUICK_FETCH_PRESET = "llama-tiny"
DATA = "python-stdlib"
ROUND_WITNESS_TIME = 0.2
"""The shipped configs' RoundWitness window (seconds); `--round-witness-time` changes it."""


@dataclass(frozen=True)
class Shape:
    """What one training step is: the model and its batch."""

    model: str
    batch: int
    seq_len: int
    micro_batch: int
    device: str = "cpu"
    """`--device` of both sides; each trains in the client's default dtype there (`--dtype
    auto`: fp32 on the CPU, bf16 on CUDA)."""


def progress(message: str) -> None:
    print(f"[bench/client] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- baseline


def bare_worker(shape: Shape, out: Path) -> None:
    """The baseline, run as a separate process next to the client run: the same model, data
    and micro-batching trained by a plain loop with AdamW, forever (the parent kills it); one
    ``start end`` line (monotonic seconds, system-wide on Linux) per step goes to ``out``."""
    from psyche_client.training.model.device import resolve_device
    from psyche_client.training.model.loading import load_model
    from psyche_client.training.model.numerics import enable_tf32, model_dtype
    from psyche_client.training.model.precision import Precision
    from psyche_common.batch_id import BatchId
    from psyche_common.data.builtin import BuiltinDataProvider

    device = resolve_device(shape.device)
    model, _ = load_model(shape.model, device=device, dtype=model_dtype(Precision(), device))
    enable_tf32(device)  # as the client does
    provider = BuiltinDataProvider(DATA, shape.seq_len, None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    with out.open("a") as log:
        step = 0
        while True:
            batch = BatchId(step * shape.batch, (step + 1) * shape.batch - 1)
            started = time.monotonic()
            tokens = torch.from_numpy(provider.read(batch).astype("int64")).to(device)
            optimizer.zero_grad(set_to_none=True)
            for micro in torch.split(tokens, shape.micro_batch):
                loss = model(input_ids=micro, labels=micro).loss
                float(loss.detach())  # the client reads every micro-batch's loss too
                (loss * (micro.shape[0] / shape.batch)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the step's kernels are done
            log.write(f"{started} {time.monotonic()}\n")
            log.flush()
            step += 1


def start_bare_worker(shape: Shape, threads: int, out: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    command = [sys.executable, __file__, "--bare-worker", str(out), "--threads", str(threads)]
    command += ["--batch", str(shape.batch), "--seq-len", str(shape.seq_len)]
    command += ["--micro-batch", str(shape.micro_batch), "--model", shape.model]
    command += ["--device", shape.device]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)


def wait_for_first_bare_step(
    worker: subprocess.Popen[bytes], out: Path, timeout: float = 300
) -> None:
    """Until the baseline has stepped once: on a loaded machine its start (torch, the model)
    can take longer than a short client run's first rounds, and only its steps inside the
    client's window count."""
    deadline = time.monotonic() + timeout
    while not (out.exists() and out.read_text().strip()):
        if worker.poll() is not None:
            raise RuntimeError(f"the bare loop exited with {worker.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the bare loop did not step within {timeout:g}s")
        time.sleep(0.1)


def bare_in_window(out: Path, shape: Shape, start: float, end: float) -> dict[str, float]:
    """Baseline tokens/s over its steps that ran entirely inside the client's window."""
    steps = []
    for line in out.read_text().splitlines():
        a, b = (float(x) for x in line.split())
        if a >= start and b <= end:
            steps.append(b - a)
    if len(steps) < 2:
        raise RuntimeError(f"only {len(steps)} baseline steps inside the client's window")
    return {
        "tokens_per_sec": shape.batch * shape.seq_len * len(steps) / sum(steps),
        "step_seconds": statistics.median(steps),
        "steps": len(steps),
    }


# ---------------------------------------------------------------------------- instrumentation


@dataclass
class Probe:
    """Timers wrapped around the client's calls (any thread); events in monotonic seconds."""

    intervals: list[tuple[str, float, float]] = field(default_factory=list)
    states: list[tuple[float, float, str, int, int]] = field(default_factory=list)
    """(monotonic, wall, state, step, run_state_start_ms) of each state change."""

    def timed(self, kind: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                self.intervals.append((kind, started, time.monotonic()))

        return wrapper

    def timed_async(self, kind: str, function: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return await function(*args, **kwargs)
            finally:
                self.intervals.append((kind, started, time.monotonic()))

        return wrapper


def install_probe(probe: Probe) -> Callable[[], None]:
    """Wrap the client's methods with timers; returns the function that unwraps them."""
    from psyche_client.round import runner as round_runner
    from psyche_client.round import training as round_training
    from psyche_client.training import distro_backend, trainer

    backend = distro_backend.DistroBackend
    runner = round_runner.RoundRunner
    training = round_training.RoundTraining
    originals: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, replacement: Any) -> None:
        originals.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)

    patch(backend, "train", probe.timed("backend_train", backend.train))
    patch(backend, "apply", probe.timed("apply", backend.apply))
    patch(backend, "decode", probe.timed("decode", backend.decode))
    patch(backend, "weights_hash", probe.timed("weights_hash", backend.weights_hash))
    patch(training, "_fetch", probe.timed_async("data_fetch", training._fetch))
    train = trainer.Trainer.train

    def trainer_train(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = train(self, *args, **kwargs)
        end = time.monotonic()
        generate_start = end - output.optimizer_seconds
        probe.intervals.append(
            ("forward_backward", generate_start - output.forward_backward_seconds, generate_start)
        )
        probe.intervals.append(("distro_generate", generate_start, end))
        return output

    patch(trainer.Trainer, "train", trainer_train)
    on_state = runner.on_state

    async def observed_on_state(self: Any, coordinator: Any) -> None:
        probe.states.append(
            (
                time.monotonic(),
                time.time(),
                coordinator.run_state.name,
                int(coordinator.progress.step),
                coordinator.run_state_start_ms,
            )
        )
        await on_state(self, coordinator)

    patch(runner, "on_state", observed_on_state)

    def restore() -> None:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)

    return restore


def round_breakdown(
    probe: Probe, measured: list[tuple[int, float, float, int]], starts: dict[int, float]
) -> dict[str, Any]:
    """Per trained round — from the start of its training (for a round prepared during the
    previous RoundWitness, that moment) to the start of the next one's — medians of where the
    wall time went. `starts`: step -> training start of every trained round."""
    witness = {step: mono for mono, _, state, step, _ in probe.states if state == "RoundWitness"}
    next_train = {step: mono for mono, _, state, step, _ in probe.states if state == "RoundTrain"}
    rows = []
    for step, start, training_done, _ in measured:
        if step + 1 not in starts:
            continue
        end = starts[step + 1]

        def spent(kind: str, start: float = start, end: float = end) -> float:
            return sum(b - a for k, a, b in probe.intervals if k == kind and start <= a < end)

        forward_backward = spent("forward_backward")
        generate = spent("distro_generate")
        backend_train = spent("backend_train")
        row = {
            "round_wall": end - start,
            "apply_previous_results": spent("apply"),
            "data_fetch": spent("data_fetch"),
            "forward_backward": forward_backward,
            "distro_generate": generate,
            "encode_and_commitment": backend_train - forward_backward - generate,
            "decode_results": spent("decode"),
            "weights_hash": spent("weights_hash"),
            "training": training_done - start,
            # the device idles from the end of this training to the start of the next
            "idle_after_training": end - training_done,
        }
        if step in witness and step + 1 in next_train:
            row["round_witness_phase"] = next_train[step + 1] - witness[step]
        rows.append(row)
    if not rows:
        raise RuntimeError("no complete round to break down")
    keys = [key for key in rows[0] if all(key in r for r in rows)]
    breakdown = {key: round(statistics.median(r[key] for r in rows), 3) for key in keys}
    breakdown["protocol_overhead"] = round(
        statistics.median(
            r["round_wall"] - r["forward_backward"] - r["distro_generate"] for r in rows
        ),
        3,
    )
    return breakdown


# ---------------------------------------------------------------------------- client run


def client_run(
    tmp: Path, shape: Shape, steps: int, witness_time: float, evals: bool = False
) -> dict[str, Any]:
    from psyche_client.app import ClientApp, ClientOptions, ServerOptions
    from psyche_client.app.options import client_p2p_config
    from psyche_client.evals.options import EvalOptions
    from psyche_client.weights.backends import BackendOptions
    from psyche_common.protocol import Identity

    from bench.harness.client_run import Cluster, write_state
    from bench.support.eval_tasks import write_tasks

    state = write_state(
        tmp / "state.toml",
        init_min_clients=1,
        total_steps=steps + 1,
        batch=shape.batch,
        seq_len=shape.seq_len,
        max_round_train_time=900,
        epoch_time=3600,
        warmup_time=60,
        round_witness_time=witness_time,
    )
    text = state.read_text().replace("\nmin_clients = 2", "\nmin_clients = 1")
    text = text.replace('repo_id = "builtin:llama-tiny"', f'repo_id = "{shape.model}"')
    state.write_text(text)
    probe = Probe()
    restore = install_probe(probe)
    cluster = Cluster(tmp, state)
    cluster.start_server()
    try:
        app = ClientApp(
            ClientOptions(
                ServerOptions(f"127.0.0.1:{cluster.port}", "e2e-run"),
                Identity.generate(),
                p2p=client_p2p_config(bind_host="127.0.0.1", advertise_host="127.0.0.1"),
                backend=BackendOptions(device=shape.device, micro_batch_size=shape.micro_batch),
                evals=EvalOptions(
                    tasks=("tiny_mc",),
                    tasks_dir=write_tasks(tmp / "tasks"),
                    heldout_every=1,
                    heldout_sequences=8,
                )
                if evals
                else EvalOptions(),
            )
        )
        code = asyncio.run(app.run())
        if code != 0:
            raise RuntimeError(f"client exited with {code}:\n{cluster.diagnostics()}")
    finally:
        cluster.stop()
        restore()
    # skip the first two rounds (model load, first apply); the last trained round only marks
    # the end of the window: a round starts when its training starts (for a prepared round,
    # during the previous RoundWitness), so the window holds whole rounds, protocol included
    trained = app.stats.trained_rounds
    rounds = trained[2:-1]
    if len(rounds) < 2:
        raise RuntimeError(f"only {len(trained)} trained rounds")
    end = trained[-1][1]
    wall = end - rounds[0][1]
    tokens = sum(r[3] for r in rounds)
    return {
        "tokens_per_sec": tokens / wall,
        "window": (rounds[0][1], end),
        "rounds": len(rounds),
        "evals_completed": len(app.stats.eval_history),
        "breakdown": round_breakdown(probe, rounds, {r[0]: r[1] for r in trained}),
    }


def joiner_fetch(preset: str) -> dict[str, float]:
    from psyche_client.p2p.benchmark import measure_parameter_fetch
    from psyche_client.training.model.loading import builtin_config, config_from_dict
    from transformers import AutoModelForCausalLM

    config = config_from_dict(builtin_config(preset))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    total_mb = count * 4 / (1024 * 1024)  # fp32 bytes
    result = asyncio.run(measure_parameter_fetch(total_mb, peers=3, parameter_count=len(params)))
    result["model_parameters"] = count
    result["model"] = f"builtin:{preset}"
    return result


def measure_case(
    shape: Shape,
    steps: int,
    repeats_count: int,
    threads: int,
    witness_time: float,
    evals: bool = False,
) -> dict[str, Any]:
    """The client next to the bare loop, `repeats_count` times; the median ratio and the
    breakdown of the most typical repeat."""
    repeats = []
    for index in range(repeats_count):
        progress(
            f"batch {shape.batch}: repeat {index + 1}/{repeats_count}: "
            "1-client run next to the bare loop"
        )
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "bare.log"
            worker = start_bare_worker(shape, threads, out)
            try:
                wait_for_first_bare_step(worker, out)
                client = client_run(Path(tmp), shape, steps, witness_time, evals)
            finally:
                worker.terminate()
                worker.wait(30)
            bare = bare_in_window(out, shape, *client["window"])
        breakdown = client["breakdown"]
        repeats.append(
            {
                "bare_tokens_per_sec": round(bare["tokens_per_sec"], 1),
                "bare_step_seconds": round(bare["step_seconds"], 3),
                "bare_steps_in_window": bare["steps"],
                "client_tokens_per_sec": round(client["tokens_per_sec"], 1),
                "client_over_bare": round(client["tokens_per_sec"] / bare["tokens_per_sec"], 3),
                "client_forward_backward_share_of_wall": round(
                    breakdown["forward_backward"] / breakdown["round_wall"], 3
                ),
                # the same work timed on both sides at the same moment: 1.0 = equally fast
                "bare_step_over_client_forward_backward": round(
                    bare["step_seconds"] / breakdown["forward_backward"], 3
                ),
                "client_rounds_measured": client["rounds"],
                "evals_completed": client["evals_completed"],
                "client_round_breakdown_seconds": breakdown,
            }
        )
        progress(json.dumps(repeats[-1]))
    median = statistics.median(r["client_over_bare"] for r in repeats)
    typical = min(repeats, key=lambda r: abs(r["client_over_bare"] - median))
    breakdown = typical["client_round_breakdown_seconds"]
    return {
        "batch": shape.batch,
        "seq_len": shape.seq_len,
        "micro_batch": shape.micro_batch,
        "tokens_per_step": shape.batch * shape.seq_len,
        "client_over_bare": median,
        "client_over_bare_per_repeat": [r["client_over_bare"] for r in repeats],
        "evals": evals,
        "evals_completed": sum(r["evals_completed"] for r in repeats),
        "bare_step_seconds": typical["bare_step_seconds"],
        "step_compute_seconds": breakdown["forward_backward"],
        "protocol_overhead_seconds_per_step": breakdown["protocol_overhead"],
        "typical_repeat": typical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=None, help="global batch of the long step")
    parser.add_argument(
        "--short-batch", type=int, default=10, help="global batch of the short (~0.5 s) step"
    )
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (256)")
    parser.add_argument("--micro-batch", type=int, default=None, help="micro-batch size (8)")
    parser.add_argument("--steps", type=int, default=None, help="trained steps per run (7)")
    parser.add_argument("--repeats", type=int, default=None, help="client runs (3; median)")
    parser.add_argument("--model", default=None, help=f"model of the step ({MODEL})")
    parser.add_argument("--quick", action="store_true", help="everything at its smallest")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side")
    parser.add_argument("--skip-fetch", action="store_true", help="skip the joiner fetch")
    parser.add_argument(
        "--evals", action="store_true", help="also measure the long step with evals on"
    )
    parser.add_argument("--skip-short", action="store_true", help="skip the short-step case")
    parser.add_argument("--skip-long", action="store_true", help="skip the long-step case")
    parser.add_argument(
        "--build-134m", type=Path, default=None, help="write the 134M Llama here and use it"
    )
    parser.add_argument(
        "--round-witness-time",
        type=float,
        default=ROUND_WITNESS_TIME,
        help=f"the run's RoundWitness window in seconds ({ROUND_WITNESS_TIME}, as shipped)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda or cuda:N: where the client and the bare loop train (cpu)",
    )
    parser.add_argument("--bare-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    if args.build_134m is not None:
        args.model = str(write_llama_134m(args.build_134m))
    model = args.model or (QUICK_MODEL if quick else MODEL)
    shape = Shape(
        model,
        args.batch or (4 if quick else 64),
        args.seq_len or (32 if quick else 256),
        args.micro_batch or (2 if quick else 8),
        args.device,
    )
    steps = args.steps or (6 if quick else 7)
    repeats = args.repeats or (1 if quick else 3)
    torch.set_num_threads(args.threads)
    if args.bare_worker is not None:
        bare_worker(shape, args.bare_worker)
        return
    logging.disable(logging.WARNING)
    load_before = os.getloadavg()
    if args.evals:  # the eval task's data is a local file: never the Hub
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="bench-datasets-"))
    witness_time = args.round_witness_time
    cases: dict[str, dict[str, Any]] = {}
    if not args.skip_long:
        cases["long_step"] = measure_case(shape, steps, repeats, args.threads, witness_time)
    if args.evals:
        cases["long_step_with_evals"] = measure_case(
            shape, steps, repeats, args.threads, witness_time, True
        )
    if not (args.skip_short or quick):
        short = Shape(
            model,
            args.short_batch,
            shape.seq_len,
            min(shape.micro_batch, args.short_batch),
            args.device,
        )
        cases["short_step"] = measure_case(short, steps * 2, repeats, args.threads, witness_time)
    result: dict[str, Any] = {
        "benchmark": "client",
        "quick": quick,
        "model": model,
        "device": args.device,
        "data": DATA,
        "torch_threads": args.threads,
        "round_witness_time": witness_time,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "baseline": (
            "a bare PyTorch loop (same model, data, batch, micro-batches, clipping; AdamW) in a "
            "separate process running at the same time as the client run, each side with "
            f"{args.threads} torch thread(s); tokens/s over its steps inside the client's "
            "measured window, so both see the same machine load"
        ),
        "differences_from_baseline": (
            "client: DisTrO (lookahead, generate, encode, decode and apply of its own result), "
            "data via the provider, and the coordinator protocol; baseline: one AdamW step"
        ),
        "client_over_bare_long_step": cases.get("long_step", {}).get("client_over_bare"),
        "client_over_bare_short_step": cases.get("short_step", {}).get("client_over_bare"),
        "client_over_bare_long_step_with_evals": cases.get("long_step_with_evals", {}).get(
            "client_over_bare"
        ),
        "cases": cases,
    }
    if not args.skip_fetch:
        progress("late-joiner fetch")
        fetch = joiner_fetch(QUICK_FETCH_PRESET if quick else FETCH_PRESET)
        result["joiner_fetch"] = fetch
        result["joiner_fetch_ratio_p2p_over_raw"] = fetch["ratio_p2p_over_raw"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
