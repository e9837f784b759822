"""Per-client batch shares with real processes: dummy clients of different speeds
(`--dummy-seconds-per-sample`), and real-model CPU clients one of which is slower
(`slow_trainer_client.py`), get shares that follow their speed, with identical weights and
nobody dropped; a witness that times every result at 1 ms gains no share; a client too slow
for its first shares misses rounds, gets a smaller share and is not dropped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.harness.mixed_run import run_mixed

LIAR = str(Path(__file__).resolve().parent / "speed_liar_client.py")
SLOW = str(Path(__file__).resolve().parent / "slow_trainer_client.py")


def _last_steps(trained: dict[int, int], count: int) -> list[int]:
    return [trained[step] for step in sorted(trained)[-count:]]


@pytest.mark.timeout(300)
def test_shares_converge_to_the_clients_speeds(tmp_path: Path) -> None:
    outcome = run_mixed(tmp_path, [0.08, 0.08, 0.02], steps=10, batch=24, shares=True)
    assert outcome.exit_codes == [0, 0, 0]
    assert outcome.hashes_agree and outcome.common_steps >= 5
    assert outcome.dropped == 0
    slow, _, fast = outcome.trained
    assert _last_steps(slow, 1) and _last_steps(fast, 1)
    # equal shares are 8 each; speeds 1 : 1 : 4 ask for 4, 4, 16
    assert all(samples >= 2 * max(_last_steps(slow, 3)) for samples in _last_steps(fast, 3))
    first_step = min(set(slow) & set(fast))
    assert slow[first_step] == fast[first_step] == 8  # a new member starts equal


@pytest.mark.timeout(300)
def test_a_witness_that_says_every_result_came_at_once_gains_no_share(tmp_path: Path) -> None:
    outcome = run_mixed(
        tmp_path,
        [0.05] * 4,
        steps=10,
        batch=32,
        shares=True,
        programs={0: [sys.executable, LIAR]},
    )
    assert outcome.exit_codes == [0] * 4
    assert outcome.hashes_agree and outcome.dropped == 0
    liar = _last_steps(outcome.trained[0], 4)
    assert liar and max(liar) <= 12, liar  # the mean share is 8; the cap would be 32


@pytest.mark.timeout(300)
def test_a_client_that_misses_its_first_rounds_gets_a_smaller_share(tmp_path: Path) -> None:
    # the equal share (8 samples) takes the slow client 4.8 s, past the 4 s RoundTrain
    outcome = run_mixed(
        tmp_path, [0.01, 0.01, 0.6], steps=10, batch=24, shares=True, max_round_train_time=4
    )
    assert outcome.exit_codes == [0, 0, 0]
    assert outcome.dropped == 0
    assert outcome.hashes_agree and outcome.common_steps >= 5
    slow = outcome.trained[2]
    assert all(samples < 8 for samples in _last_steps(slow, 3)), slow


@pytest.mark.timeout(480)
def test_real_model_shares_follow_a_slower_cpu_client(tmp_path: Path) -> None:
    """Three CPU clients train `builtin:llama-tiny`; one takes 0.3 s more per sample
    (`slow_trainer_client.py`, as a weaker device would). Its share shrinks below the equal
    one, the weights stay identical and nobody is dropped."""
    outcome = run_mixed(
        tmp_path,
        [0.0, 0.0, 0.0],
        steps=10,
        batch=12,
        shares=True,
        real_model=True,
        programs={2: [sys.executable, SLOW]},
        timeout=420,
    )
    assert outcome.exit_codes == [0, 0, 0]
    assert outcome.dropped == 0
    assert outcome.hashes_agree and outcome.common_steps >= 5
    fast, _, slow = outcome.trained
    # equal shares are 4 each: the slow client's falls below, a fast one's rises above
    assert all(samples < 4 for samples in _last_steps(slow, 3)), slow
    assert all(samples > 4 for samples in _last_steps(fast, 3)), fast
