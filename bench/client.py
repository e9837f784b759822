"""Client benchmark: prints one JSON object.

1. Training throughput: tokens/s of one client in a 1-client run (real `psyche-server`
   process, in-process `ClientApp`, DisTrO, builtin:llama-2m on CPU) vs the same model and
   batch shapes trained by a bare PyTorch loop (forward/backward + AdamW) in this process.
   The client figure is wall-clock over the steady rounds (the first two are skipped), so it
   includes everything a run costs: waiting for states, apply, DisTrO, witness phase.
   `client_training_share_of_wall` (round start → training done, over wall time) is the
   load-independent part: the rest is protocol time (RoundWitness lasts ≥ round_witness_time,
   ticks are 0.5 s). On a shared, loaded machine the two tokens/s figures are noisy; the
   baseline is measured before and after the client run and averaged.
2. Late-joiner model fetch: seconds to fetch a ~20M-parameter model's bytes peer-to-peer
   (`psyche_client.p2p.benchmark`, 3 serving peers, hash-checked parameters) vs a raw
   loopback socket copy of the same bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "builtin:llama-2m"
SEQ_LEN = 256
BATCH = 32
MICRO_BATCH = 8
STEPS = 8


def bare_loop_tokens_per_sec(steps: int = 6) -> float:
    from psyche_client.model_io import load_model

    model, _ = load_model(MODEL, device="cpu", dtype=torch.float32)
    vocab = model.config.vocab_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(steps):
        tokens = torch.from_numpy(rng.integers(0, vocab, (BATCH, SEQ_LEN)))
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for micro in torch.split(tokens, MICRO_BATCH):
            loss = model(input_ids=micro, labels=micro).loss * (micro.shape[0] / BATCH)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        times.append(time.perf_counter() - started)
    steady = times[1:]
    return BATCH * SEQ_LEN * len(steady) / sum(steady)


def client_run_tokens_per_sec(tmp: Path) -> dict[str, float]:
    from psyche_client.app import ClientApp, ClientOptions
    from psyche_common.protocol import Identity

    from tests.e2e.client_run import Cluster, write_state

    state = write_state(
        tmp / "state.toml",
        init_min_clients=1,
        total_steps=STEPS + 1,
        batch=BATCH,
        seq_len=SEQ_LEN,
        max_round_train_time=60,
        warmup_time=60,
    )
    text = state.read_text().replace("min_clients = 2", "min_clients = 1")
    text = text.replace('repo_id = "builtin:llama-tiny"', f'repo_id = "{MODEL}"')
    state.write_text(text)
    cluster = Cluster(tmp, state)
    cluster.start_server()
    try:
        app = ClientApp(
            ClientOptions(
                server_addr=f"127.0.0.1:{cluster.port}",
                run_id="e2e-run",
                identity=Identity.generate(),
                bind_p2p_interface="127.0.0.1",
                advertise_host="127.0.0.1",
                device="cpu",
                micro_batch_size=MICRO_BATCH,
            )
        )
        code = asyncio.run(app.run())
        if code != 0:
            raise RuntimeError(f"client exited with {code}:\n{cluster.diagnostics()}")
    finally:
        cluster.stop()
    rounds = app.stats.trained_rounds[2:]
    if len(rounds) < 2:
        raise RuntimeError(f"only {len(app.stats.trained_rounds)} trained rounds")
    wall = rounds[-1][2] - rounds[0][1]
    tokens = sum(r[3] for r in rounds)
    compute = sum(r[2] - r[1] for r in rounds)
    return {
        "tokens_per_sec": tokens / wall,
        "training_share_of_wall": compute / wall,
        "rounds": len(rounds),
    }


def joiner_fetch() -> dict[str, float]:
    from psyche_client.model_io import builtin_config, config_from_dict
    from psyche_client.p2p.benchmark import measure_parameter_fetch
    from transformers import AutoModelForCausalLM

    config = config_from_dict(builtin_config("llama-20m"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    total_mb = count * 4 / (1024 * 1024)  # fp32 bytes
    result = asyncio.run(measure_parameter_fetch(total_mb, peers=3, parameter_count=len(params)))
    result["model_parameters"] = count
    return result


def main() -> None:
    logging.disable(logging.WARNING)
    torch.set_num_threads(2)
    # the machine is shared and noisy: measure the baseline before and after the client run
    # and compare with their mean (both are reported)
    bare_before = bare_loop_tokens_per_sec()
    with tempfile.TemporaryDirectory() as tmp:
        client = client_run_tokens_per_sec(Path(tmp))
    bare_after = bare_loop_tokens_per_sec()
    bare = (bare_before + bare_after) / 2
    fetch = joiner_fetch()
    print(
        json.dumps(
            {
                "model": MODEL,
                "tokens_per_step": BATCH * SEQ_LEN,
                "bare_pytorch_tokens_per_sec": round(bare, 1),
                "bare_before_after": [round(bare_before, 1), round(bare_after, 1)],
                "client_tokens_per_sec": round(client["tokens_per_sec"], 1),
                "client_over_bare": round(client["tokens_per_sec"] / bare, 3),
                "client_training_share_of_wall": round(client["training_share_of_wall"], 3),
                "client_rounds_measured": client["rounds"],
                "joiner_fetch": fetch,
                "joiner_fetch_ratio_p2p_over_raw": fetch["ratio_p2p_over_raw"],
            }
        )
    )


if __name__ == "__main__":
    main()
