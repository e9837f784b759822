"""Joining mid-epoch with real processes (`[config] join_mid_epoch`): a client started while
the epoch runs follows the rounds, fetches the members' snapshot, proves its weights and is
seated; its first result is applied within 5 rounds of its Join, every client (the joiner
too) holds the same weights at every step, and nobody is dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.join_run import run_join


@pytest.mark.timeout(300)
def test_a_client_started_mid_epoch_trains_within_five_rounds(tmp_path: Path) -> None:
    outcome = run_join(tmp_path, steps=24, join_after_step=2, batch=16, seconds_per_sample=0.01)
    assert outcome.exit_codes == [0, 0, 0, 0]
    assert outcome.first_applied_step is not None, "no result of the joiner was applied"
    rounds = outcome.join_to_first_applied_rounds
    assert rounds is not None and rounds <= 5
    assert outcome.hashes_agree and outcome.joiner_steps >= 5
    assert outcome.dropped == 0
