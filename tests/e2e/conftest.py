"""Fixtures of the end-to-end tests: clean runs shared by the attack tests that compare
their loss with a run without the attacker."""

from __future__ import annotations

from typing import Protocol

import pytest

from bench.harness.attack_run import RunOutcome, run_attack

ATTACK_TEST_STEPS = 8


class CleanRun(Protocol):
    def __call__(
        self, quantize_1bit: bool, verification_percent: int, steps: int = ATTACK_TEST_STEPS
    ) -> RunOutcome: ...


@pytest.fixture(scope="session")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> CleanRun:
    """`clean_run(quantize_1bit, verification_percent, steps)`: four honest clients, the
    attack tests' settings (`ATTACK_TEST_STEPS` steps unless told), run once per setting in a
    session."""
    done: dict[tuple[bool, int, int], RunOutcome] = {}

    def get(
        quantize_1bit: bool, verification_percent: int, steps: int = ATTACK_TEST_STEPS
    ) -> RunOutcome:
        key = (quantize_1bit, verification_percent, steps)
        if key not in done:
            name = f"clean-{'1bit' if quantize_1bit else 'bf16'}-{verification_percent}-{steps}"
            outcome = run_attack(
                tmp_path_factory.mktemp(name),
                None,
                clients=4,
                steps=steps,
                quantize_1bit=quantize_1bit,
                verification_percent=verification_percent,
            )
            assert outcome.honest_ok and outcome.hashes_agree, outcome.diagnostics
            assert outcome.eval_loss is not None, "the clean run wrote no checkpoint"
            done[key] = outcome
        return done[key]

    return get
