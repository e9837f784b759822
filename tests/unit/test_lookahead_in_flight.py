"""The DisTrO lookahead anticipates only an own result that is still in flight.

Regression of a false conviction (docs/verification.md): at 50 % verification an honest
trainer verified step S − 1 and trained step S. Its last result (step S − 2) was already in the
weights of round S, yet it still trained at `theta − lr·sign(delta)`; for that batch the
gradient there agreed 0.55 with the gradient at the round's weights, its result scored 0.439
at the verifiers (threshold 0.6), and two honest verifiers convicted it. Replayed from the run's
logs, the same result without the lookahead scores 0.999.
"""

from __future__ import annotations

import numpy as np
import torch
from psyche_client.distro.in_flight import OwnSteps
from psyche_client.training.trainer import Trainer
from psyche_client.verify.recompute import recompute_gradient
from psyche_common.batch_id import BatchId

from tests.unit.test_trainer import make_trainer, tokens

LR = 0.05  # a large step: the lookahead moves the weights visibly


def result_bytes(trainer: Trainer, step: int, batch: BatchId, data: np.ndarray) -> bytes:
    out = trainer.train(batch, data, step, LR, LR)
    assert out.result is not None
    return out.result.encode()


def test_own_steps_looks_ahead_only_after_the_step_before() -> None:
    steps = OwnSteps()
    assert steps.lookahead_lr(1, 0.1) == 0.0  # nothing trained yet
    steps.trained(1)
    assert steps.lookahead_lr(2, 0.1) == 0.1
    assert steps.lookahead_lr(3, 0.1) == 0.0  # step 2 skipped: step 1 is applied already
    steps.trained(3)
    assert steps.lookahead_lr(3, 0.1) == 0.0  # a second batch of step 3: still nothing
    steps.trained(3)
    assert steps.lookahead_lr(4, 0.1) == 0.1
    steps.trained(4)
    assert steps.lookahead_lr(4, 0.1) == 0.1  # a second batch of step 4: step 3 in flight
    steps.reset()
    assert steps.lookahead_lr(5, 0.1) == 0.0


def test_no_lookahead_after_a_skipped_step() -> None:
    """Trained step 1, verified step 2, trains step 3: the result is the one trained with no
    lookahead at all, for every batch of the step."""
    trainer, twin = make_trainer(), make_trainer()  # the same model and history
    for one in (trainer, twin):
        result_bytes(one, 1, BatchId(0, 3), tokens(0))
    for batch, seed in ((BatchId(8, 11), 2), (BatchId(12, 15), 3)):
        out = twin.train(batch, tokens(seed), 3, LR, 0.0)
        assert out.result is not None
        assert result_bytes(trainer, 3, batch, tokens(seed)) == out.result.encode()


def test_lookahead_after_training_the_step_before() -> None:
    """Trained step 1, trains step 2: its step-1 result is in flight and is anticipated."""
    trainer, twin = make_trainer(), make_trainer()
    for one in (trainer, twin):
        result_bytes(one, 1, BatchId(0, 3), tokens(0))
    out = twin.train(BatchId(4, 7), tokens(1), 2, LR, 0.0)
    assert out.result is not None
    assert result_bytes(trainer, 2, BatchId(4, 7), tokens(1)) != out.result.encode()


def test_a_trainer_back_from_a_verifier_round_folds_in_the_verifiers_gradient() -> None:
    """What the verifier recomputes (the plain gradient at the round's weights) is exactly
    what a trainer that skipped the step before folds into its momentum (before clipping)."""
    latest: dict[str, torch.Tensor] = {}
    trainer = make_trainer()
    for name, parameter in trainer.model.named_parameters():
        # after each micro-batch's backward: the last call sees the gradient generate gets
        parameter.register_post_accumulate_grad_hook(
            lambda p, name=name: latest.__setitem__(name, p.grad.detach().clone())
        )
    result_bytes(trainer, 1, BatchId(0, 3), tokens(0))
    data = tokens(5)
    expected = recompute_gradient(trainer.model, data, 2, torch.device("cpu"))
    result_bytes(trainer, 3, BatchId(8, 11), data)
    got = [latest[name] for name in sorted(latest)]
    assert trainer.settings.clip_grad_norm is None  # what generate sees is the whole gradient
    assert len(got) == len(expected)
    for grad, reference in zip(got, expected, strict=True):
        assert reference is not None
        torch.testing.assert_close(grad, reference, rtol=1e-5, atol=1e-7)
