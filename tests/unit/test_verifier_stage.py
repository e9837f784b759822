"""The client's verifier stage: the agreement measure on a real model, the per-round checks,
and `RoundVerifier` recomputing, scoring and reporting with a fake backend."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from psyche_client.distro import DistroSettings
from psyche_client.round.checks import Score, Thresholds, VerifierChecks, agreement_milli, failure
from psyche_client.round.context import RoundContext
from psyche_client.round.roles import RoundRoles
from psyche_client.round.state import DownloadStatus, ResultDownload, RoundState
from psyche_client.round.stats import ClientStats
from psyche_client.round.verifier import RoundVerifier
from psyche_client.training.backend import Capabilities, DummyBackend
from psyche_client.training.trainer import Trainer
from psyche_client.verify.agreement import (
    ACCUSE_BELOW,
    agreement_at,
    gradient_coefficients,
    sign_agreement,
)
from psyche_client.verify.recompute import recompute_gradient
from psyche_common.batch_id import BatchId
from psyche_common.bloom import Bloom
from psyche_common.coordinator.committee import Committee, CommitteeProof
from psyche_common.coordinator.types import sample_commitment
from psyche_common.coordinator.verification import verifier_sample
from psyche_common.protocol import Identity

from bench.study.simulation import build_model, load_stdlib_corpus, prototype_llama_config
from tests.support.coordinators import make_coordinator
from tests.support.fakes import RecordingUplink, unsigned_result

SETTINGS = DistroSettings(
    compression_decay=0.999,
    compression_topk=8,
    compression_chunk=64,
    quantize_1bit=True,
    clip_grad_norm=1.0,
)


def test_an_honest_result_agrees_and_a_negated_one_does_not() -> None:
    corpus = load_stdlib_corpus()
    tokens = corpus.batch(np.random.default_rng(3), 2, 128)
    model = build_model(prototype_llama_config(), 0)
    verifier_model = copy.deepcopy(model)
    trainer = Trainer(model, SETTINGS, device="cpu", micro_batch_size=2)
    out = trainer.train(BatchId(0, 1), tokens, 1, 1e-3, 0.0)
    assert out.result is not None
    grads = recompute_gradient(verifier_model, tokens, 2, torch.device("cpu"))
    assert all(p.grad is None for p in verifier_model.parameters())  # left clean
    reference = gradient_coefficients(trainer.distro.compressor, grads)
    honest = sign_agreement(out.result, reference)
    assert honest.weighted > 0.95 and honest.positions > 1000
    chosen = [
        (payload.indices(), -np.sign(payload.values(out.result.value_kind)))
        for payload in out.result.tensors
    ]
    negated = agreement_at(chosen, reference)
    assert negated.weighted < 0.05
    assert negated.fraction == pytest.approx(1.0 - honest.fraction)
    with pytest.raises(ValueError, match="tensors"):
        sign_agreement(out.result, reference[:-1])


def test_checks_score_each_result_once_and_report_each_batch_once() -> None:
    checks = VerifierChecks(b"w" * 32, {BatchId(0, 1): object(), BatchId(4, 5): object()})
    assert not checks.wants(BatchId(0, 1), b"h" * 32)  # the sample is not revealed yet
    checks.reveal([BatchId(0, 1)])
    assert list(checks.references) == [BatchId(0, 1)]
    assert checks.wants(BatchId(0, 1), b"h" * 32)
    assert not checks.wants(BatchId(2, 3), b"h" * 32)
    checks.scored.add(b"h" * 32)
    assert not checks.wants(BatchId(0, 1), b"h" * 32)
    assert checks.verdict(BatchId(0, 1), 0.9, ACCUSE_BELOW) is False  # a pass: attested
    assert checks.verdict(BatchId(2, 3), 0.1, ACCUSE_BELOW) is True  # accused
    assert checks.verdict(BatchId(2, 3), 0.05, ACCUSE_BELOW) is None  # already reported
    assert checks.verdict(BatchId(4, 5), float("nan"), ACCUSE_BELOW) is True
    assert [agreement_milli(x) for x in (0.1234, -1.0, 2.0, float("nan"))] == [123, 0, 1000, 0]


class FakeVerifyingBackend:
    """Weights are a label; the reference of a batch is its first sample value; a result's
    agreement is what its payload says."""

    def __init__(self) -> None:
        self.weights = b"w" * 32
        self.recomputed: list[int] = []
        self.lookaheads: list[Any] = []
        self.capabilities = Capabilities(verifier=self)

    def weights_hash(self) -> bytes:
        return self.weights

    def recompute(self, samples: Any, step: int = 0, along: Any = None) -> object | None:
        self.recomputed.append(int(samples[0][0]))
        self.lookaheads.append(along)
        return int(samples[0][0])

    def agreement(self, reference: object, result: Any) -> float:
        return float(result.scores.get(reference, result.score))

    def overlap(self, result: Any, other: Any) -> float:
        return len(result.positions & other.positions) / max(1, len(result.positions))


@dataclass(frozen=True)
class ScoredResult:
    """A decoded result whose agreement with a reference is `scores[reference]`, else
    `score`; its top-k positions are `positions`."""

    score: float
    trainer_nonce: int = 0
    positions: frozenset[int] = frozenset()
    scores: dict[object, float] = field(default_factory=dict)

    def __hash__(self) -> int:
        return id(self)


ME = Identity.from_secret_bytes(bytes([42]) * 32)
"""The verifier under test (its round's one verifier: it checks the whole group sample)."""
BATCHES = tuple(BatchId(i * 4, i * 4 + 3) for i in range(4))
OWNERS = {batch: bytes([i + 1]) * 32 for i, batch in enumerate(BATCHES)}


def a_round(
    step: int, committee: Committee, assignments: dict[BatchId, bytes], seed: int
) -> RoundState:
    """Round `step` (height step − 4) in which this client is in `committee`, trains nothing."""
    roles = RoundRoles(
        step=step,
        height=step - 4,
        my_index=0,
        committee_proof=CommitteeProof(committee, 0, 0),
        witness_proof=None,
        selection=None,
        assignments=dict(assignments),
        batch_ids=tuple(sorted(assignments)),
        my_batches=(),
        random_seed=seed,
        verifiers=(ME.public_key,) if committee == Committee.Verifier else (),
    )
    return RoundState.start(roles, 5, True, 0.0, bloom_factory=lambda n: Bloom.random())


def verifier_round(seed: int = 11) -> RoundState:
    round_ = a_round(7, Committee.Verifier, OWNERS, seed)
    assert round_.roles.is_verifier and not round_.roles.is_trainer
    return round_


SAMPLE_SEED = bytes([11]) * 32


def reveal(ctx: RoundContext, step: int = 7) -> None:
    """The coordinator's broadcast with round `step` in RoundWitness: its sample seed out."""
    coord = make_coordinator()
    coord.progress.step = step
    round_ = coord.current_round()
    round_.sample_seed = SAMPLE_SEED
    round_.sample_commit = sample_commitment(SAMPLE_SEED)
    round_.sample_revealed = True
    ctx.coordinator = coord


def make_verifier(
    revealed: bool = True,
) -> tuple[RoundVerifier, RoundContext, FakeVerifyingBackend, RecordingUplink]:
    ctx = RoundContext(ME, ClientStats())
    if revealed:
        reveal(ctx)
    backend = FakeVerifyingBackend()
    ctx.backend = backend  # type: ignore[assignment]
    uplink = RecordingUplink()

    async def fetch(batch: BatchId) -> np.ndarray:
        return np.full((2, 8), batch.start, dtype=np.int64)

    return RoundVerifier(ctx, uplink, fetch), ctx, backend, uplink  # type: ignore[arg-type]


def verified_result(
    batch: BatchId,
    score: float,
    tag: bytes,
    positions: frozenset[int] = frozenset(),
    scores: dict[object, float] | None = None,
) -> ResultDownload:
    return ResultDownload(
        unsigned_result(OWNERS[batch], batch, tag * 32),
        batch,
        status=DownloadStatus.VERIFIED,
        result=ScoredResult(score, positions=positions, scores=scores or {}),
    )


async def settle(checks: VerifierChecks, scores: int) -> None:
    """Wait (up to 5 s) until `scores` results are scored (scoring runs in threads)."""
    for _ in range(500):
        if len(checks.agreements) >= scores:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # let a report that follows the last score go out


async def test_the_verifier_recomputes_every_batch_and_checks_its_sample_once_revealed() -> None:
    verifier, ctx, backend, uplink = make_verifier(revealed=False)
    round_ = verifier_round()
    ctx.current = round_
    await verifier.recompute(round_)
    # the sample is secret until the round's RoundWitness: every batch is recomputed
    assert round_.checks is not None and list(round_.checks.references) == list(BATCHES)
    assert backend.recomputed == [batch.start for batch in BATCHES]
    sample = verifier_sample(SAMPLE_SEED, ctx.me, BATCHES, [ctx.me])
    good, bad = sample
    unsampled = next(b for b in BATCHES if b not in sample)
    round_.downloads[b"a" * 32] = verified_result(good, 0.95, b"a")
    round_.downloads[b"b" * 32] = verified_result(bad, 0.05, b"b")
    round_.downloads[b"c" * 32] = verified_result(unsampled, 0.0, b"c")
    verifier.check_rounds()
    await asyncio.sleep(0.05)
    assert round_.checks.scored == set() and uplink.accusations == []  # not revealed yet
    reveal(ctx)
    verifier.check_rounds()
    assert list(round_.checks.references) == sample
    verifier.check_rounds()  # nothing is scored twice
    await settle(round_.checks, 2)
    await ctx.tasks.aclose()
    assert uplink.accusations == [(7, OWNERS[bad], bad, 50)]
    assert uplink.attestations == [(7, OWNERS[good], good, 950, b"a" * 32)]  # the pass, too
    assert round_.checks.agreements == {b"a" * 32: 0.95, b"b" * 32: 0.05}


async def test_the_verifier_skips_when_the_weights_moved() -> None:
    verifier, _, backend, _ = make_verifier()
    round_ = verifier_round()
    original = verifier.fetch_samples
    assert original is not None

    async def fetch_then_apply(batch: BatchId) -> np.ndarray:
        backend.weights = b"x" * 32  # the next round's early apply ran meanwhile
        return await original(batch)

    verifier.fetch_samples = fetch_then_apply
    await verifier.recompute(round_)
    assert round_.checks is None and backend.recomputed == []


async def test_batches_recomputed_before_the_weights_moved_are_kept() -> None:
    verifier, _, backend, _ = make_verifier(revealed=False)
    round_ = verifier_round()
    original = verifier.fetch_samples
    assert original is not None

    async def apply_after_two(batch: BatchId) -> np.ndarray:
        if len(backend.recomputed) == 2:
            backend.weights = b"x" * 32  # the next round's early apply ran meanwhile
        return await original(batch)

    verifier.fetch_samples = apply_after_two
    await verifier.recompute(round_)
    assert round_.checks is not None and list(round_.checks.references) == list(BATCHES[:2])
    assert backend.recomputed == [batch.start for batch in BATCHES[:2]]


async def test_a_backend_without_checks_verifies_nothing() -> None:
    verifier, ctx, _, _ = make_verifier()
    ctx.backend = DummyBackend(0.0)
    round_ = verifier_round()
    await verifier.recompute(round_)
    assert round_.checks is None


def test_each_check_fails_on_its_own() -> None:
    thresholds = Thresholds(agreement=0.6, margin=-0.25, overlap=0.7)
    assert failure(Score(0.9, 0.05, 0.1, b"x" * 32), thresholds) is None
    assert failure(Score(0.5, 0.05), thresholds) == "disagrees"
    assert failure(Score(float("nan")), thresholds) == "disagrees"
    assert failure(Score(0.9, 0.05, 0.95, b"x" * 32), thresholds) == "copy"
    assert failure(Score(0.9, 0.05, 0.4, b"x" * 32), thresholds) is None  # honest overlap
    assert failure(Score(0.9, None, 1.0, None), thresholds) is None  # nothing it copied
    assert failure(Score(0.9, -0.3), thresholds) == "other_data"
    assert failure(Score(0.9, -0.2), thresholds) is None  # within the honest spread
    assert failure(Score(0.9, None), thresholds) is None  # one batch: no margin


async def test_a_later_copy_of_another_trainers_result_is_accused_and_the_original_passes() -> None:
    verifier, ctx, _, uplink = make_verifier()
    round_ = verifier_round()
    ctx.current = round_
    await verifier.recompute(round_)
    assert round_.checks is not None
    first, second = verifier_sample(SAMPLE_SEED, ctx.me, BATCHES, [ctx.me])
    picks = frozenset(range(100))
    round_.downloads[b"o" * 32] = verified_result(first, 0.95, b"o", picks)
    # announced later, the same positions under another trainer's name and batch
    round_.downloads[b"c" * 32] = verified_result(second, 0.9, b"c", picks)
    verifier.check_rounds()
    await settle(round_.checks, 2)
    await ctx.tasks.aclose()
    assert uplink.attestations == [(7, OWNERS[first], first, 950, b"o" * 32)]
    assert uplink.accusations == [(7, OWNERS[second], second, 900)]


async def test_a_result_waits_for_the_results_announced_before_it() -> None:
    verifier, ctx, _, uplink = make_verifier()
    round_ = verifier_round()
    ctx.current = round_
    await verifier.recompute(round_)
    assert round_.checks is not None
    first, second = verifier_sample(SAMPLE_SEED, ctx.me, BATCHES, [ctx.me])
    unsampled = next(b for b in BATCHES if b not in (first, second))
    picks = frozenset(range(100))
    pending = verified_result(unsampled, 0.9, b"p", picks)
    pending.status = DownloadStatus.PENDING
    round_.downloads[b"p" * 32] = pending
    round_.downloads[b"c" * 32] = verified_result(second, 0.9, b"c", picks)
    verifier.check_rounds()
    await asyncio.sleep(0.05)
    assert round_.checks.scored == set()  # the earlier result is still downloading
    pending.status = DownloadStatus.VERIFIED
    verifier.check_rounds()
    await settle(round_.checks, 1)
    await ctx.tasks.aclose()
    assert uplink.accusations == [(7, OWNERS[second], second, 900)]  # a copy of it


async def test_a_result_that_follows_another_batch_better_than_its_own_is_accused() -> None:
    verifier, ctx, _, uplink = make_verifier()
    round_ = verifier_round()
    ctx.current = round_
    await verifier.recompute(round_)
    assert round_.checks is not None
    first, second = verifier_sample(SAMPLE_SEED, ctx.me, BATCHES, [ctx.me])
    # references are the batches' first sample values (FakeVerifyingBackend.recompute)
    own, other = first.start, second.start
    round_.downloads[b"s" * 32] = verified_result(
        first, 0.65, b"s", frozenset({1}), {own: 0.65, other: 0.95}
    )
    round_.downloads[b"h" * 32] = verified_result(
        second, 0.9, b"h", frozenset({2}), {other: 0.9, own: 0.85}
    )
    verifier.check_rounds()
    await settle(round_.checks, 2)
    await ctx.tasks.aclose()
    assert uplink.accusations == [(7, OWNERS[first], first, 650)]  # margin -0.30
    assert uplink.attestations == [(7, OWNERS[second], second, 900, b"h" * 32)]


async def test_a_slow_first_announcer_delays_the_checks_by_the_capped_wait_only() -> None:
    """A result announced first whose blob never finishes downloading (its trainer serves it
    a byte at a time) held every later result's score for the whole round; now each later
    result waits at most `earlier_wait` seconds, then is scored against what settled."""
    verifier, ctx, _, uplink = make_verifier()
    now = [100.0]
    verifier = RoundVerifier(
        ctx, uplink, verifier.fetch_samples, earlier_wait=5.0, clock=lambda: now[0]
    )
    round_ = verifier_round()
    ctx.current = round_
    await verifier.recompute(round_)
    assert round_.checks is not None
    first, second = verifier_sample(SAMPLE_SEED, ctx.me, BATCHES, [ctx.me])
    unsampled = next(b for b in BATCHES if b not in (first, second))
    slow = verified_result(unsampled, 0.9, b"p", frozenset(range(100)))
    slow.status = DownloadStatus.PENDING
    round_.downloads[b"p" * 32] = slow
    round_.downloads[b"a" * 32] = verified_result(first, 0.95, b"a", frozenset({1}))
    verifier.check_rounds()
    now[0] += 2.0
    round_.downloads[b"b" * 32] = verified_result(second, 0.05, b"b", frozenset({2}))
    verifier.check_rounds()
    now[0] += 2.9
    verifier.check_rounds()
    await asyncio.sleep(0.05)
    assert round_.checks.scored == set()  # 4.9 s: still waiting for the slow one
    now[0] += 0.1
    verifier.check_rounds()  # the first result's wait is over; the second's is not
    await settle(round_.checks, 1)
    assert round_.checks.scored == {b"a" * 32}
    now[0] += 2.0
    verifier.check_rounds()
    await settle(round_.checks, 2)
    await ctx.tasks.aclose()
    assert uplink.attestations == [(7, OWNERS[first], first, 950, b"a" * 32)]
    assert uplink.accusations == [(7, OWNERS[second], second, 50)]
    assert slow.status is DownloadStatus.PENDING  # scored without it


def previous_round(assignments: dict[BatchId, bytes]) -> RoundState:
    """The round before `verifier_round` (step 6), with `assignments`."""
    return a_round(6, Committee.Trainer, assignments, 3)


async def test_each_batch_is_recomputed_at_its_trainers_lookahead_point() -> None:
    """A trainer that trained the step before looked ahead along its published result of that
    step (`distro.lookahead`): the verifier recomputes its batch there (`along` = that
    verified result; the last of its batches when it had several), at the round's weights
    for a trainer with no batch then, and not at all when that result is not to be had (it
    cannot know the point; guessing would accuse an honest trainer)."""
    verifier, ctx, backend, _ = make_verifier(revealed=False)
    first, second, third, fourth = BATCHES
    earlier = [BatchId(100 + 4 * i, 103 + 4 * i) for i in range(4)]
    prior = previous_round(
        {
            earlier[0]: OWNERS[first],
            earlier[1]: OWNERS[first],  # two batches: its last one is the direction
            earlier[2]: OWNERS[second],
            earlier[3]: OWNERS[third],
        }
    )
    old_first = ResultDownload(
        unsigned_result(OWNERS[first], earlier[0], b"p" * 32),
        earlier[0],
        status=DownloadStatus.VERIFIED,
        result=ScoredResult(0.9),
    )
    last_first = ResultDownload(
        unsigned_result(OWNERS[first], earlier[1], b"q" * 32),
        earlier[1],
        status=DownloadStatus.VERIFIED,
        result=ScoredResult(0.9),
    )
    failed_second = ResultDownload(
        unsigned_result(OWNERS[second], earlier[2], b"r" * 32),
        earlier[2],
        status=DownloadStatus.FAILED,
    )
    prior.downloads.update({b"p" * 32: old_first, b"q" * 32: last_first, b"r" * 32: failed_second})
    # the third trainer announced nothing for its batch of step 6: nothing of its own in flight
    ctx.previous = prior
    round_ = verifier_round()
    ctx.current = round_
    await verifier.recompute(round_)
    assert round_.checks is not None
    assert list(round_.checks.references) == [first, third, fourth]  # second: unknown point
    assert backend.recomputed == [first.start, third.start, fourth.start]
    assert backend.lookaheads == [last_first.result, None, None]
    # prepared early, during the round before's RoundWitness: that round is still the current
    backend.lookaheads.clear()
    ctx.current, ctx.previous = prior, None
    early = verifier_round()
    await verifier.recompute(early)
    assert backend.lookaheads == [last_first.result, None, None]
