"""Which of a client's own DisTrO results are still in flight, for the lookahead (pure).

Results are applied two rounds late: round S applies the results of step S − 2. A trainer
that trained step S − 1 knows an update of its own is on its way that the weights of round S
do not hold yet, and the lookahead anticipates it: it trains at `theta − lr(S−1)·sign(delta)`.
A trainer that did not train step S − 1 (a verifier that round, or given no batch) has nothing
in flight: its last result, of step S − 2 or earlier, is already in the weights. The reference
never meets this case (every client trains every round); looking ahead anyway would move the
weights a whole step of `lr` again along the update they already hold, and the gradient there
can differ from the gradient at the round's weights so much that a verifier, recomputing at
those weights, scores the honest result below its threshold (docs/verification.md).

`OwnSteps` remembers the steps this client trained; `lookahead_lr` gives the lookahead's
learning rate for the next one: `prev_lr` when the client trained the step just before, else
0 (no lookahead). Every batch of one step gets the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OwnSteps:
    """The last two distinct steps this client produced results for."""

    last: int | None = None
    before_last: int | None = None

    def previous(self, step: int) -> int | None:
        """The last step before `step` that this client trained (None: none remembered)."""
        return self.before_last if step == self.last else self.last

    def lookahead_lr(self, step: int, prev_lr: float) -> float:
        """The lookahead's learning rate for training `step`: `prev_lr` when this client's
        result of step − 1 is in flight, else 0."""
        return prev_lr if self.previous(step) == step - 1 else 0.0

    def trained(self, step: int) -> None:
        """A result of `step` was produced."""
        if step != self.last:
            self.before_last, self.last = self.last, step

    def reset(self) -> None:
        """Forget every step (the momentum was reset: nothing of it is in flight)."""
        self.last = self.before_last = None
