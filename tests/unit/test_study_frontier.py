"""The optimizer study's figures (bench/study/study_frontier.py): tokens to reach a loss on
AdamW's curve, the sweep's pick, a row's ratios, the frontier, the bests and the goals."""

from __future__ import annotations

import dataclasses

import pytest

from bench.study.study_frontier import (
    FrontierEntry,
    Measurement,
    StudyRow,
    best_at,
    frontier,
    goals,
    pick_lr,
    study_row,
    tokens_to_reach,
)

CURVE = [(0, 5.5), (1000, 3.0), (2000, 2.5), (3000, 2.2)]


def test_tokens_to_reach_interpolates_between_the_points_around_the_target() -> None:
    assert tokens_to_reach(CURVE, 2.75) == pytest.approx(1500.0)
    assert tokens_to_reach(CURVE, 2.2) == 3000.0
    assert tokens_to_reach(CURVE, 3.0) == 1000.0


def test_tokens_to_reach_a_loss_at_or_above_the_start_is_zero() -> None:
    assert tokens_to_reach(CURVE, 6.0) == 0.0


def test_tokens_to_reach_a_loss_adamw_never_reached_is_none() -> None:
    assert tokens_to_reach(CURVE, 2.1) is None


def test_tokens_to_reach_takes_the_first_crossing_of_a_noisy_curve() -> None:
    noisy = [(0, 4.0), (100, 3.0), (200, 3.5), (300, 2.0)]
    assert tokens_to_reach(noisy, 3.2) == pytest.approx(80.0)


def test_pick_lr_takes_the_lowest_loss_and_says_when_it_is_at_an_end_of_the_sweep() -> None:
    assert pick_lr({1e-3: 2.5, 2e-3: 2.4, 4e-3: 2.6}) == (2e-3, False)
    assert pick_lr({1e-3: 2.5, 2e-3: 2.6, 4e-3: 2.7}) == (1e-3, True)
    assert pick_lr({1e-3: 2.9, 2e-3: 2.6, 4e-3: 2.5}) == (4e-3, True)
    assert pick_lr({3e-3: 2.0}) == (3e-3, False)
    with pytest.raises(ValueError, match="no sweep run"):
        pick_lr({})


def measurement(**changes: object) -> Measurement:
    base = Measurement(
        name="sparseloco-p4",
        family="sparseloco",
        stage="seeds",
        peers=4,
        lr=2e-3,
        seed=1,
        synchronous=False,
        val_loss=2.75,
        tokens=3000,
        payload_bytes_per_round=500,
        framing_bytes_per_round=100,
        tokens_per_peer_round=2500,  # 5 inner steps of 500 tokens
        peer_tokens_per_step=500,
        replicas_identical=True,
        captured_energy=0.4,
        index_overlap=0.1,
        seconds=1.0,
        cpu_seconds=0.9,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_row_compares_loss_tokens_and_bytes_with_adamw() -> None:
    row = study_row(measurement(), adamw_val=2.5, adamw_curve=CURVE, parameters=10_000)
    assert row.loss_vs_adamw == pytest.approx(1.1)
    assert row.adamw_tokens_to_same_loss == pytest.approx(1500.0)
    assert row.tokens_to_target_ratio == pytest.approx(0.5)
    assert row.payload_bytes_per_token == pytest.approx(0.2)
    assert row.framing_bytes_per_token == pytest.approx(0.04)
    # dense bf16: 20,000 bytes per step of 500 tokens = 40 per token; payload 0.2 per token
    assert row.bytes_ratio == pytest.approx(200.0)


def test_an_adamw_row_has_no_bytes_and_a_row_better_than_adamw_no_token_ratio() -> None:
    adamw = measurement(
        name="adamw", family="adamw", payload_bytes_per_round=0, framing_bytes_per_round=0
    )
    row = study_row(adamw, adamw_val=2.75, adamw_curve=CURVE, parameters=10_000)
    assert row.loss_vs_adamw == 1.0
    assert (row.bytes_ratio, row.payload_bytes_per_token, row.framing_bytes_per_token) == (
        None,
        None,
        None,
    )
    better = study_row(measurement(val_loss=2.0), 2.2, CURVE, 10_000)
    assert better.adamw_tokens_to_same_loss is None
    assert better.tokens_to_target_ratio is None


def test_a_row_that_sent_bytes_for_no_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="sparseloco-p4"):
        study_row(measurement(tokens_per_peer_round=0), 2.5, CURVE, 10_000)


def row(name: str, seed: int, ratio: float, **changes: object) -> StudyRow:
    made = study_row(measurement(name=name, seed=seed, val_loss=2.5 * ratio), 2.5, CURVE, 10_000)
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


def test_the_frontier_averages_each_setting_over_its_fresh_seeds_only() -> None:
    rows = [
        row("sparseloco-p4", 0, 0.5, stage="sweep"),  # the sweep seed: not in the frontier
        row("sparseloco-p4", 2, 1.04),
        row("sparseloco-p4", 1, 1.02),
        row("sparseloco-p4", 3, 1.06),
        row("adamw", 1, 1.0, family="adamw", bytes_ratio=None),
        row("diloco-p4", 1, 1.01, stage="diloco", bytes_ratio=5.0),
    ]
    entries = frontier(rows)
    assert [e.name for e in entries] == ["sparseloco-p4", "diloco-p4"]  # by bytes_ratio
    sparse = entries[0]
    assert sparse.seeds == pytest.approx([1.02, 1.04, 1.06])  # seed order
    assert sparse.loss_vs_adamw_mean == pytest.approx(1.04)
    assert sparse.seed_max_above_mean == pytest.approx(0.02)
    assert sparse.bytes_ratio == pytest.approx(200.0)
    assert sparse.tokens_to_target_ratio is not None
    assert not sparse.diagnostic
    assert entries[1].diagnostic


def test_the_frontier_has_no_token_ratio_when_adamw_never_reached_one_seed() -> None:
    rows = [row("x", 1, 1.02), row("x", 2, 0.7)]
    assert rows[1].tokens_to_target_ratio is None
    assert frontier(rows)[0].tokens_to_target_ratio is None


def entry(
    name: str, ratio: float, loss: float, spread: float = 0.0, **changes: object
) -> FrontierEntry:
    made = FrontierEntry(name, ratio, loss, [loss], spread, None, False)
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


def test_best_at_takes_the_lowest_mean_loss_at_or_above_the_ratio_and_skips_diagnostics() -> None:
    entries = [
        entry("dense-sync", 700.0, 1.0, diagnostic=True),
        entry("a", 650.0, 1.10),
        entry("b", 600.0, 1.07),
        entry("c", 200.0, 1.02),
        entry("d", 100.0, 1.00),
    ]
    assert best_at(entries, 600.0) == "b"
    assert best_at(entries, 146.0) == "c"
    assert best_at(entries, 1000.0) is None


def test_goals_need_the_mean_and_the_seed_spread() -> None:
    met = goals([entry("c", 200.0, 1.03, 0.02), entry("b", 600.0, 1.08, 0.0)])
    assert [(g.best, g.met) for g in met] == [("c", True), ("b", True)]
    spread = goals([entry("c", 200.0, 1.02, 0.03), entry("b", 600.0, 1.09)])
    assert [(g.best, g.met) for g in spread] == [("c", False), ("b", False)]
    assert [(g.best, g.met) for g in goals([])] == [(None, False), (None, False)]
