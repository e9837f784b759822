"""A trainer that negates its gradients, against DisTrO's lookahead: how its results score
with a verifier and how much it harms training; prints one JSON object.

The attack of tests/e2e/signflip_client.py: every gradient negated as backward computes it,
the rest of the DisTrO step (momentum, error feedback, the lookahead along its own published
result: `distro.lookahead`) the trainer's own. Runs of the simulation of
bench/study/simulation.py (prototype model, 4 peers, chunk 64, top-k 8, 1-bit, decay 0.999,
the two-round apply delay, a constant lr as in bench/attacks.py's runs), all from the same
weights and batches, one per variant:

- `honest`: four honest peers;
- `left_out`: peer 0's results are never applied (three honest peers' updates);
- `negating`: peer 0 negates its gradients, its results applied like the others';
- `negating_no_lookahead`: the same, skipping its lookahead (an attacker's answer to a check
  at the lookahead point: it trains at the round's weights, while the verifier, which cannot
  know that, recomputes at the point its published result implies).

Per variant: the held-out loss of the shared weights after the last step (64-token windows
of the corpus's last 5 %, `eval_loss`) and, per step, peer 0's weighted sign agreement
(`psyche_client.verify.agreement`) with the plain gradient of its batch where a verifier
recomputes it: at peer 0's lookahead point, along its published result of the step before
(`agreement_by_step`, `steps_below_threshold`; the accusation threshold is `ACCUSE_BELOW`),
and at the round's weights, where verifiers recomputed before the lookahead was public
(`agreement_at_weights_by_step`). Baselines in the same invocation: `honest` and `left_out`
(`loss_vs_left_out`: each variant's loss over `left_out`'s).

`--quick` (what `make test` runs): 3 steps of 2 × 32 tokens: the same code path in seconds.

Usage: .venv/bin/python bench/negated_gradients.py [--steps 30] [--seq-len 64] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from psyche_client.distro import DistroResult  # noqa: E402
from psyche_client.training.trainer import Trainer  # noqa: E402
from psyche_client.verify.agreement import (  # noqa: E402
    ACCUSE_BELOW,
    gradient_coefficients,
    sign_agreement,
)
from psyche_client.verify.recompute import recompute_gradient  # noqa: E402
from psyche_common.batch_id import BatchId  # noqa: E402

from bench.study.simulation import (  # noqa: E402
    REFERENCE_DISTRO,
    build_model,
    load_stdlib_corpus,
    prototype_llama_config,
)

VARIANTS = ("honest", "left_out", "negating", "negating_no_lookahead")
PEERS = 4


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    settings = REFERENCE_DISTRO
    corpus = load_stdlib_corpus()
    base = build_model(prototype_llama_config(), args.seed)
    per_peer = args.batch // PEERS
    trainers = [
        Trainer(copy.deepcopy(base), settings, device="cpu", micro_batch_size=per_peer)
        for _ in range(PEERS)
    ]
    negating = {"on": False}
    if variant.startswith("negating"):
        for parameter in trainers[0].model.parameters():
            parameter.register_hook(lambda grad: -grad if negating["on"] else None)
    verifier = Trainer(copy.deepcopy(base), settings, device="cpu", micro_batch_size=per_peer)
    compressor = trainers[0].distro.compressor
    rng = np.random.default_rng(1234 + args.seed)
    in_flight: dict[int, list[DistroResult]] = {}
    agreement: list[float] = []
    at_weights: list[float] = []
    previous: DistroResult | None = None  # peer 0's published result of the step before
    lr = args.lr
    for step in range(1, args.steps + 1):
        if step - 2 >= 1:
            applied = in_flight.pop(step - 2)
            for trainer in [*trainers, verifier]:
                trainer.apply(applied, step, lr)
        tokens = corpus.batch(rng, args.batch, args.seq_len)
        shares = [tokens[r * per_peer : (r + 1) * per_peer] for r in range(PEERS)]
        cpu = torch.device("cpu")
        # what a verifier does: recompute at the lookahead point of peer 0's published result
        # of the step before (`DistroBackend.recompute`); and, for comparison, at the weights
        with verifier.optimizer.verifier_point(previous, lr):
            grads = recompute_gradient(verifier.model, shares[0], per_peer, cpu)
        reference = gradient_coefficients(compressor, grads)
        plain = gradient_coefficients(
            compressor, recompute_gradient(verifier.model, shares[0], per_peer, cpu)
        )
        produced = []
        for r, trainer in enumerate(trainers):
            negating["on"] = r == 0
            no_lookahead = r == 0 and variant == "negating_no_lookahead"
            try:
                out = trainer.train(
                    BatchId(r * per_peer, (r + 1) * per_peer - 1),
                    shares[r],
                    step,
                    lr,
                    0.0 if no_lookahead else lr,
                )
            finally:
                negating["on"] = False
            assert out.result is not None
            produced.append(trainer.decode_result(out.result.encode()))
        agreement.append(round(sign_agreement(produced[0], reference).weighted, 4))
        at_weights.append(round(sign_agreement(produced[0], plain).weighted, 4))
        previous = produced[0]
        in_flight[step] = produced[1:] if variant == "left_out" else produced
    return {
        "eval_loss": round(trainers[1].evaluate(corpus.validation(64, args.seq_len)), 4),
        "agreement_by_step": agreement,
        "steps_below_threshold": sum(a < ACCUSE_BELOW for a in agreement),
        "agreement_at_weights_by_step": at_weights,
        "steps_below_threshold_at_weights": sum(a < ACCUSE_BELOW for a in at_weights),
        "weights_agree": len({t.weights_hash() for t in trainers}) == 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per variant (30)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (8)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (64)")
    parser.add_argument("--lr", type=float, default=3e-3, help="constant learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 short steps (seconds)")
    args = parser.parse_args()
    args.steps = args.steps or (3 if args.quick else 30)
    args.batch = args.batch or (PEERS * (1 if args.quick else 2))
    args.seq_len = args.seq_len or (32 if args.quick else 64)
    if args.batch % PEERS or args.steps < 1 or args.seq_len < 2:
        parser.error(
            f"--batch must be a positive multiple of {PEERS}, --steps at least 1 and "
            f"--seq-len at least 2 (got {args.batch}, {args.steps}, {args.seq_len})"
        )
    torch.set_num_threads(1)
    started = time.perf_counter()
    variants = {name: run_variant(name, args) for name in VARIANTS}
    left_out = variants["left_out"]["eval_loss"]
    report = {
        "benchmark": "negated_gradients",
        "quick": args.quick,
        "settings": {
            "steps": args.steps,
            "peers": PEERS,
            "batch": args.batch,
            "seq_len": args.seq_len,
            "lr": args.lr,
            "accuse_below": ACCUSE_BELOW,
        },
        "variants": variants,
        "loss_vs_left_out": {
            name: round(v["eval_loss"] / left_out, 4) for name, v in variants.items()
        },
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
