"""Sign agreement of honest and malicious DisTrO results with a verifier's recomputed gradient.

Runs the simulation of bench/study/simulation.py (prototype model, 4 peers, chunk 64,
top-k 8, 1-bit, decay 0.999, the two-round apply delay) for `--steps` steps. At each step of
`--at`, before the peers train, a verifier recomputes the plain gradient of every peer's batch
on the round's weights (no lookahead, no momentum) and takes its DCT; after training, each
peer's result is compared with it (`psyche_client.verify.agreement`) as:

- `honest`: the peer's own result;
- `sign_flip`: the same result with every value negated;
- `free_rider`: the next peer's result (another batch) re-announced for this batch;
- `random`: random signs at random positions (k per chunk);
- `negated_gradients` (reported apart, per measured step in `by_step`): a shadow of peer 0
  that trains the same batches on the same weights with every gradient negated as backward
  computes it (the attack of tests/e2e/signflip_client.py), its momentum, error feedback and
  lookahead its own, its results never applied. Unlike `sign_flip` it is not the negation of
  the honest result: it trains at its own lookahead point, while this bench recomputes at
  the round's weights (bench/negated_gradients.py recomputes where the client's verifier
  does, at the trainer's lookahead point; docs/verification.md).

Two more measures for the detectors of docs/verification.md ("Copiers and free riders"):

- `overlap`: top-k index overlap (`psyche_client.verify.copying.index_overlap`) of each honest
  result with every other peer's result of the same step (`overlap_honest`: the largest per
  result, what a verifier comparing a result with all others of its round sees), and of a
  copy with a result of the step before (`overlap_previous_step`: how much one peer's picks
  persist between steps, the overlap a copier of an old result would show); a copy of a
  result of the same step overlaps it by 1.0 by construction;
- `margin`: weighted agreement with the result's own batch minus with another batch of the
  same step (the verifier's second sample), for `honest`, a `copy` measured against its
  source's batch (`copy_vs_source`) or a third batch (`copy_vs_third`), and a `stale` result
  (the peer's own result of the previous step it trained, re-announced: a free rider that
  trained on other data).

`--constant-lr`: `--lr` at every step (the schedule of bench/attacks.py's real-process runs)
instead of the cosine schedule (warmup over 20 steps, then down to a tenth of `--lr` at the
last step).

`--train-every 2`: each peer trains only every other step (peer r at steps where step + r is
even), as a trainer does when half of the clients verify each round; its momentum then holds
gradients of weights two steps older. The "third" batch of a margin is then a batch of the
step that nobody trained on.

Prints one JSON object: per case the unweighted (`fraction`) and |coefficient|-weighted
(`weighted`) agreements, each as min / mean / max over all (step, peer) pairs, every sample,
and the median seconds of a verifier's recompute (forward/backward + DCT) and score, and of a
trainer's `train` (forward/backward + DisTrO encode) for one peer's share.

`--quick` (what `make test` runs): 3 steps measured at steps 1 and 3 (the first after an
apply), one 64-token sequence per peer: the same code path in seconds.

Usage: .venv/bin/python bench/verification.py [--steps 150] [--at 5,25,50,100,150]
[--train-every 2] [--constant-lr] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from psyche_client.distro import DistroResult, DistroSettings  # noqa: E402
from psyche_client.training.trainer import Trainer  # noqa: E402
from psyche_client.verify.agreement import (  # noqa: E402
    Agreement,
    agreement_at,
    gradient_coefficients,
    sign_agreement,
)
from psyche_client.verify.copying import index_overlap  # noqa: E402
from psyche_client.verify.recompute import recompute_gradient  # noqa: E402
from psyche_common.batch_id import BatchId  # noqa: E402

from bench.study.simulation import (  # noqa: E402
    build_model,
    cosine_schedule,
    load_stdlib_corpus,
    prototype_llama_config,
)

CASES = ("honest", "sign_flip", "free_rider", "random")
MARGINS = ("honest", "copy_vs_source", "copy_vs_third", "stale")
OVERLAPS = ("overlap_honest", "overlap_previous_step")


def indices(result: DistroResult) -> list[np.ndarray]:
    return [payload.indices() for payload in result.tensors]


def flipped(agreement: Agreement) -> Agreement:
    """A negated 1-bit result agrees exactly where the original disagrees."""
    return Agreement(1.0 - agreement.fraction, 1.0 - agreement.weighted, agreement.positions)


def random_agreement(
    result: DistroResult, coefficients: list[np.ndarray], rng: np.random.Generator
) -> Agreement:
    chosen = []
    for payload, coef in zip(result.tensors, coefficients, strict=True):
        shape = payload.indices().shape
        idx = np.stack([rng.permutation(coef.shape[1])[: shape[1]] for _ in range(shape[0])])
        chosen.append((idx, rng.choice([-1.0, 1.0], size=shape)))
    return agreement_at(chosen, coefficients)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 4),
        "mean": round(float(np.mean(values)), 4),
        "max": round(max(values), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps (150)")
    parser.add_argument("--at", default=None, help="measured steps (5,25,50,100,150)")
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (8)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (256)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--train-every",
        type=int,
        default=1,
        help="each peer trains every Nth step (2: half train each step, as with 50%% verifiers)",
    )
    parser.add_argument(
        "--constant-lr",
        action="store_true",
        help="a constant --lr from step 1 (bench/attacks.py's runs), not the cosine schedule",
    )
    parser.add_argument("--quick", action="store_true", help="3 short steps (seconds)")
    args = parser.parse_args()
    quick = args.quick
    args.steps = args.steps or (3 if quick else 150)
    args.at = args.at or ("1,3" if quick else "5,25,50,100,150")
    args.batch = args.batch or (args.peers if quick else 8)
    args.seq_len = args.seq_len or (64 if quick else 256)
    torch.set_num_threads(1)
    measure_at = {int(s) for s in args.at.split(",") if s}
    settings = DistroSettings(
        compression_decay=0.999,
        compression_topk=8,
        compression_chunk=64,
        quantize_1bit=True,
        clip_grad_norm=1.0,
    )
    corpus = load_stdlib_corpus()
    peak = args.lr
    schedule = (lambda _step: peak) if args.constant_lr else cosine_schedule(peak, args.steps)
    base = build_model(prototype_llama_config(), args.seed)
    per_peer = args.batch // args.peers
    trainers = [
        Trainer(copy.deepcopy(base), settings, device="cpu", micro_batch_size=per_peer)
        for _ in range(args.peers)
    ]
    verifier_model = copy.deepcopy(base)
    # a shadow of peer 0 that trains its batches on negated gradients (what
    # tests/e2e/signflip_client.py does), on the same weights; its results are never applied
    negater = Trainer(copy.deepcopy(base), settings, device="cpu", micro_batch_size=per_peer)
    negating = {"on": False}
    for parameter in negater.model.parameters():
        parameter.register_hook(lambda grad: -grad if negating["on"] else None)
    negated_samples: list[dict[str, float]] = []
    compressor = trainers[0].distro.compressor
    rng = np.random.default_rng(1234 + args.seed)
    noise = np.random.default_rng(99)
    in_flight: dict[int, list[DistroResult]] = {}
    previous: dict[int, DistroResult] = {}
    samples: list[dict[str, object]] = []
    started = time.perf_counter()
    recompute_seconds: list[float] = []
    score_seconds: list[float] = []
    train_seconds: list[float] = []
    for step in range(1, args.steps + 1):
        if step - 2 >= 1:
            applied = in_flight.pop(step - 2)
            for trainer in [*trainers, negater]:
                trainer.apply(applied, step, schedule(step))
        tokens = corpus.batch(rng, args.batch, args.seq_len)
        shares = [tokens[r * per_peer : (r + 1) * per_peer] for r in range(args.peers)]
        coefficients = []
        if step in measure_at:
            verifier_model.load_state_dict(trainers[0].model.state_dict())
            for share in shares:
                t0 = time.perf_counter()
                grads = recompute_gradient(verifier_model, share, per_peer, torch.device("cpu"))
                coefficients.append(gradient_coefficients(compressor, grads))
                recompute_seconds.append(time.perf_counter() - t0)
        active = [r for r in range(args.peers) if (step + r) % args.train_every == 0]
        produced: dict[int, DistroResult] = {}
        for r in active:
            out = trainers[r].train(
                BatchId(r * per_peer, (r + 1) * per_peer - 1),
                shares[r],
                step,
                schedule(step),
                schedule(step - 1),
            )
            assert out.result is not None
            train_seconds.append(out.forward_backward_seconds + out.optimizer_seconds)
            produced[r] = trainers[r].decode_result(out.result.encode())
        in_flight[step] = list(produced.values())
        if 0 in active:
            negating["on"] = True
            try:
                shadow = negater.train(
                    BatchId(0, per_peer - 1), shares[0], step, schedule(step), schedule(step - 1)
                )
            finally:
                negating["on"] = False
            assert shadow.result is not None
            if step in measure_at:
                negated = sign_agreement(
                    negater.decode_result(shadow.result.encode()), coefficients[0]
                )
                negated_samples.append(
                    {
                        "step": step,
                        "fraction": round(negated.fraction, 4),
                        "weighted": round(negated.weighted, 4),
                    }
                )
        if step in measure_at:
            for r in active:
                others = [q for q in active[active.index(r) + 1 :] + active if q != r]
                if r not in previous or not others:
                    continue
                t0 = time.perf_counter()
                honest = sign_agreement(produced[r], coefficients[r])
                score_seconds.append(time.perf_counter() - t0)
                other = produced[others[0]]
                cases = {
                    "honest": honest,
                    "sign_flip": flipped(honest),
                    "free_rider": sign_agreement(other, coefficients[r]),
                    "random": random_agreement(produced[r], coefficients[r], noise),
                }
                source = coefficients[others[0]]
                third = coefficients[
                    next(q for q in range(r + 2, r + 2 + args.peers) if q % args.peers
                         not in (r, others[0])) % args.peers
                ]  # fmt: skip
                copy_own = cases["free_rider"].weighted
                stale = previous[r]
                margins = {
                    "honest": honest.weighted - sign_agreement(produced[r], third).weighted,
                    "copy_vs_source": copy_own - sign_agreement(other, source).weighted,
                    "copy_vs_third": copy_own - sign_agreement(other, third).weighted,
                    "stale": sign_agreement(stale, coefficients[r]).weighted
                    - sign_agreement(stale, third).weighted,
                }
                mine = indices(produced[r])
                overlaps = {
                    "overlap_honest": max(
                        index_overlap(mine, indices(produced[q])) for q in others
                    ),
                    "overlap_previous_step": index_overlap(mine, indices(previous[r])),
                }
                samples.append(
                    {
                        "step": step,
                        "peer": r,
                        "positions": honest.positions,
                        **{
                            name: [round(a.fraction, 4), round(a.weighted, 4)]
                            for name, a in cases.items()
                        },
                        "margin": {name: round(v, 4) for name, v in margins.items()},
                        **{name: round(v, 4) for name, v in overlaps.items()},
                    }
                )
        previous.update(produced)
    report = {
        "benchmark": "verification",
        "quick": quick,
        "settings": {
            "steps": args.steps,
            "peers": args.peers,
            "batch": args.batch,
            "seq_len": args.seq_len,
            "chunk": 64,
            "topk": 8,
            "quantize_1bit": True,
            "decay": 0.999,
            "train_every": args.train_every,
            "lr": "constant" if args.constant_lr else "cosine",
        },
        "cases": {
            name: {
                "fraction": summary([s[name][0] for s in samples]),  # type: ignore[index]
                "weighted": summary([s[name][1] for s in samples]),  # type: ignore[index]
            }
            for name in CASES
        },
        "negated_gradients": {
            "fraction": summary([n["fraction"] for n in negated_samples]),
            "weighted": summary([n["weighted"] for n in negated_samples]),
            "by_step": negated_samples,
        },
        "margins": {
            name: summary([s["margin"][name] for s in samples])  # type: ignore[index]
            for name in MARGINS
        },
        "overlaps": {name: summary([s[name] for s in samples]) for name in OVERLAPS},  # type: ignore[misc]
        "recompute_seconds_median": round(float(np.median(recompute_seconds)), 4),
        "score_seconds_median": round(float(np.median(score_seconds)), 4),
        "train_seconds_median": round(float(np.median(train_seconds)), 4),
        "seconds": round(time.perf_counter() - started, 1),
        "samples": samples,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
