"""The slow-link check (`psyche_client.round.link_speed`): busy time of concurrent fetches,
the projection of a round's result traffic against the round time, and the warning."""

from __future__ import annotations

import logging

import pytest
from psyche_client.round.apply import ApplyStep
from psyche_client.round.context import RoundContext
from psyche_client.round.link_speed import BusyMeter, LinkVerdict, link_verdict
from psyche_client.round.state import RoundState
from psyche_client.round.stats import ClientStats
from psyche_common.batch_id import BatchId
from psyche_common.coordinator import RunState
from psyche_common.protocol import Identity

from tests.support.coordinators import coordinator_in
from tests.support.rounds import downloaded, observer_round


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_overlapping_fetches_count_their_busy_time_once() -> None:
    clock = Clock()
    meter = BusyMeter(clock)
    meter.begin()
    clock.now += 1.0
    meter.begin()  # a second fetch while the first runs: shares the link
    clock.now += 2.0
    meter.end(1000)
    clock.now += 1.0
    meter.end(3000)
    clock.now += 5.0  # idle: waiting for the next announcement is not link time
    meter.begin()
    clock.now += 0.5
    assert meter.busy() == pytest.approx(4.5)  # a running fetch counts so far
    meter.end(0)  # a failed fetch moved nothing
    assert (meter.bytes, meter.transfers, meter.busy()) == (4000, 3, pytest.approx(4.5))
    with pytest.raises(RuntimeError):
        meter.end(0)


def round_with(me: bytes, sizes: dict[bytes, int], fetched: int, busy: float) -> RoundState:
    """Round 7 where each trainer announced one result of its size; `fetched` bytes of them
    were fetched in `busy` seconds."""
    clock = Clock()
    meter = BusyMeter(clock)
    meter.begin()
    clock.now += busy
    meter.end(fetched)
    batches = {BatchId(4 * i, 4 * i + 3): sender for i, sender in enumerate(sizes)}
    round_ = observer_round(7, batches, num_clients=len(sizes))
    round_.fetches = meter
    for i, (batch, sender) in enumerate(batches.items()):
        round_.downloads[bytes([i]) * 32] = downloaded(
            bytes([i]) * 32, sender, batch, size=sizes[sender]
        )
    return round_


def test_a_round_whose_results_take_longer_than_the_round_time_is_too_slow() -> None:
    me, a, b, c = (bytes([i]) * 32 for i in range(4))
    sizes = {me: 1_000_000, a: 1_000_000, b: 1_000_000, c: 1_000_000}
    # 1 MB of the 3 MB of others' results in 4 s: 3 MB take 12 s, the round allows 10 s
    verdict = link_verdict(round_with(me, sizes, 1_000_000, 4.0), me, 10.0)
    assert verdict is not None
    assert (verdict.results, verdict.needed_bytes) == (3, 3_000_000)
    assert verdict.rate == pytest.approx(250_000)
    assert verdict.projected == pytest.approx(12.0)
    assert verdict.too_slow
    text = verdict.describe()
    assert "results of step 7 arrived at 2.00 Mbit/s" in text
    assert "take 12.0 s" in text and "max_round_train_time 10 s" in text
    assert "needs at least 2.40 Mbit/s down" in text
    assert verdict.summary().startswith("TOO SLOW: step 7 results at 2.00 Mbit/s")
    # the same bytes in 3 s: 9 s for the round, within 10 s
    fast = link_verdict(round_with(me, sizes, 1_000_000, 3.0), me, 10.0)
    assert fast is not None and not fast.too_slow and fast.summary().startswith("ok: ")


def test_nothing_fetched_is_no_verdict() -> None:
    me = b"m" * 32
    assert link_verdict(round_with(me, {me: 100}, 0, 0.0), me, 10.0) is None
    untouched = observer_round(1, {})
    assert link_verdict(untouched, me, 10.0) is None


def test_the_apply_warns_and_the_dashboard_status_names_the_rates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    identity = Identity.generate()
    me = identity.public_key
    stats = ClientStats()
    step = ApplyStep(RoundContext(identity=identity, stats=stats), uplink=None)  # type: ignore[arg-type]
    coordinator = coordinator_in(RunState.RoundTrain, [me], step=7, max_round_train_time=10)
    slow = round_with(me, {me: 10, b"a" * 32: 2_000_000}, 500_000, 4.0)
    with caplog.at_level(logging.WARNING, logger="psyche.client"):
        step._check_link(slow, coordinator)
        step._check_link(slow, coordinator)  # the same round again
    (record,) = [r for r in caplog.records if "too slow" in r.getMessage()]
    assert "take 16.0 s" in record.getMessage()
    assert record.__dict__["link_mbps"] == 1.0 and record.__dict__["needed_mbps"] == 1.6
    assert stats.link_status.startswith("TOO SLOW: step 7 results at 1.00 Mbit/s")
    caplog.clear()
    fine = round_with(me, {me: 10, b"a" * 32: 2_000_000}, 2_000_000, 1.0)
    with caplog.at_level(logging.WARNING, logger="psyche.client"):
        step._check_link(fine, coordinator)
    assert not caplog.records
    assert stats.link_status.startswith("ok: step 7 results at 16.00 Mbit/s")


def test_verdict_rate_without_busy_time_is_unbounded() -> None:
    verdict = LinkVerdict(
        step=1, results=1, needed_bytes=10, fetched_bytes=10, busy=0.0, round_time=1.0
    )
    assert not verdict.too_slow
