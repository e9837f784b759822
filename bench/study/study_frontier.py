"""The optimizer study's figures from its measured runs: rows, frontier, bests (pure functions).

- `tokens_to_reach(curve, target)`: the tokens AdamW needed to reach a validation loss, read
  off its curve of (tokens, loss) points by linear interpolation between the first point at
  or below `target` and the one before it; None when the curve never gets there (the row
  beat AdamW's final loss).
- `pick_lr(losses)`: the sweep's winner (lowest final loss) and whether it lies at an end of
  the swept range (a wider sweep might find a better one).
- `study_row(m, adamw_val, adamw_curve, parameters)`: one run as a study row:
  `loss_vs_adamw` (its final validation loss over the tuned AdamW's on the same seed),
  `adamw_tokens_to_same_loss`, `tokens_to_target_ratio` (those tokens over the row's own:
  1.0 is parity, 0.5 means AdamW got there with half the tokens), payload bytes per token
  (index and value bytes a peer sends per token it trained) with the framing per token apart,
  and `bytes_ratio`: dense bf16 bytes per token (a bf16 gradient of every parameter per step,
  over the tokens a peer trains per step) over the payload bytes per token.
- `frontier(rows)`: per compressed setting measured on the fresh seeds, a `FrontierEntry`:
  `bytes_ratio`, `loss_vs_adamw_mean`, `seeds` (the per-seed ratios, in seed order),
  `seed_max_above_mean`, `tokens_to_target_ratio` (the mean; None if AdamW never reached one
  seed's loss) and `diagnostic` (the synchronous and DiLoCo rows, never a best), by
  `bytes_ratio` descending.
- `best_at(frontier, min_ratio)`: the entry with the lowest mean loss ratio among those at
  least `min_ratio` times smaller than bf16 (None if none); `goals(frontier)`: the issue's
  goals (at >= 146x a mean <= 1.03x AdamW, at >= 600x <= 1.08x, no seed more than 0.02 above
  its mean), each with the best entry and whether it meets them.

API: `Measurement`, `StudyRow`, `FrontierEntry`, `Goal`, `tokens_to_reach`, `pick_lr`,
`study_row`, `frontier`, `best_at`, `goals`, `GOALS`, `SEED_SPREAD`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

GOALS: tuple[tuple[float, float], ...] = ((146.0, 1.03), (600.0, 1.08))
"""(at least this many times fewer bytes than bf16, at most this mean loss over AdamW's)."""
SEED_SPREAD = 0.02
"""No seed's loss ratio may lie more than this above the mean."""
FRONTIER_STAGES = ("seeds", "synchronous", "diloco")


@dataclass(frozen=True)
class Measurement:
    """What one run measured, as the row needs it."""

    name: str
    family: str  # "adamw", "distro", "sparseloco" or "diloco"
    stage: str  # "sweep", "seeds", "synchronous" or "diloco"
    peers: int
    lr: float
    seed: int
    synchronous: bool
    val_loss: float
    tokens: int
    payload_bytes_per_round: int
    framing_bytes_per_round: int
    tokens_per_peer_round: int
    peer_tokens_per_step: int
    """Tokens a peer trains per step: a dense gradient per step would cost 2 bytes per
    parameter for these (SparseLoCo's and DiLoCo's rounds span several steps)."""
    replicas_identical: bool
    captured_energy: float | None
    index_overlap: float | None
    seconds: float
    cpu_seconds: float


def tokens_to_reach(curve: Sequence[tuple[int, float]], target: float) -> float | None:
    """Tokens at which the (tokens, loss) `curve` first reaches `target` (interpolated)."""
    previous: tuple[int, float] | None = None
    for tokens, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(tokens)
            before_tokens, before_loss = previous
            fraction = (before_loss - target) / (before_loss - loss)
            return before_tokens + fraction * (tokens - before_tokens)
        previous = (tokens, loss)
    return None


def pick_lr(losses: Mapping[float, float]) -> tuple[float, bool]:
    """The learning rate with the lowest loss, and whether it is the smallest or largest swept."""
    if not losses:
        raise ValueError("no sweep run to pick a learning rate from")
    best = min(losses, key=lambda lr: (losses[lr], lr))
    at_edge = len(losses) > 1 and best in (min(losses), max(losses))
    return best, at_edge


@dataclass(frozen=True)
class StudyRow:
    """One run as a row of the study (see module doc); None where a figure does not apply
    (AdamW sends nothing; AdamW's curve never reached a loss below its own final one)."""

    name: str
    family: str
    stage: str
    peers: int
    lr: float
    seed: int
    synchronous: bool
    val_loss: float
    loss_vs_adamw: float
    tokens: int
    adamw_tokens_to_same_loss: float | None
    tokens_to_target_ratio: float | None
    payload_bytes_per_token: float | None
    framing_bytes_per_token: float | None
    bytes_ratio: float | None
    replicas_identical: bool
    captured_energy: float | None
    index_overlap: float | None
    seconds: float
    cpu_seconds: float


@dataclass(frozen=True)
class FrontierEntry:
    name: str
    bytes_ratio: float
    loss_vs_adamw_mean: float
    seeds: list[float]
    seed_max_above_mean: float
    tokens_to_target_ratio: float | None
    diagnostic: bool


@dataclass(frozen=True)
class Goal:
    min_bytes_ratio: float
    max_loss_vs_adamw: float
    best: str | None
    met: bool


def study_row(
    m: Measurement,
    adamw_val: float,
    adamw_curve: Sequence[tuple[int, float]],
    parameters: int,
) -> StudyRow:
    """One run as a row of the study (see module doc)."""
    reached = tokens_to_reach(adamw_curve, m.val_loss)
    sent = m.payload_bytes_per_round
    per_token = m.tokens_per_peer_round
    if sent > 0 and per_token <= 0:
        raise ValueError(f"run {m.name!r} sent {sent} bytes but trained no tokens per round")
    return StudyRow(
        name=m.name,
        family=m.family,
        stage=m.stage,
        peers=m.peers,
        lr=m.lr,
        seed=m.seed,
        synchronous=m.synchronous,
        val_loss=m.val_loss,
        loss_vs_adamw=m.val_loss / adamw_val,
        tokens=m.tokens,
        adamw_tokens_to_same_loss=reached,
        tokens_to_target_ratio=None if reached is None else reached / m.tokens,
        payload_bytes_per_token=sent / per_token if sent else None,
        framing_bytes_per_token=m.framing_bytes_per_round / per_token if sent else None,
        bytes_ratio=(2 * parameters / m.peer_tokens_per_step) / (sent / per_token)
        if sent
        else None,
        replicas_identical=m.replicas_identical,
        captured_energy=m.captured_energy,
        index_overlap=m.index_overlap,
        seconds=m.seconds,
        cpu_seconds=m.cpu_seconds,
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def frontier(rows: Sequence[StudyRow]) -> list[FrontierEntry]:
    """Per compressed setting of the fresh seeds, its mean loss ratio and bytes ratio."""
    groups: dict[str, list[StudyRow]] = {}
    for row in rows:
        if row.stage in FRONTIER_STAGES and row.bytes_ratio is not None:
            groups.setdefault(row.name, []).append(row)
    entries = []
    for name, group in groups.items():
        ordered = sorted(group, key=lambda row: row.seed)
        ratios = [row.loss_vs_adamw for row in ordered]
        mean = _mean(ratios)
        tokens = [row.tokens_to_target_ratio for row in ordered]
        known = [t for t in tokens if t is not None]
        assert ordered[0].bytes_ratio is not None
        entries.append(
            FrontierEntry(
                name=name,
                bytes_ratio=ordered[0].bytes_ratio,
                loss_vs_adamw_mean=mean,
                seeds=ratios,
                seed_max_above_mean=max(ratios) - mean,
                tokens_to_target_ratio=_mean(known) if len(known) == len(tokens) else None,
                diagnostic=ordered[0].stage != "seeds",
            )
        )
    return sorted(entries, key=lambda e: (-e.bytes_ratio, e.name))


def best_at(entries: Sequence[FrontierEntry], min_ratio: float) -> str | None:
    """The lowest mean loss ratio among the non-diagnostic entries >= `min_ratio` x bf16."""
    eligible = [e for e in entries if not e.diagnostic and e.bytes_ratio >= min_ratio]
    if not eligible:
        return None
    return min(eligible, key=lambda e: (e.loss_vs_adamw_mean, e.name)).name


def goals(entries: Sequence[FrontierEntry]) -> list[Goal]:
    """Each goal of `GOALS` with its best entry and whether that entry meets it."""
    by_name = {e.name: e for e in entries}
    report = []
    for min_ratio, max_loss in GOALS:
        name = best_at(entries, min_ratio)
        entry = by_name[name] if name is not None else None
        met = (
            entry is not None
            and entry.loss_vs_adamw_mean <= max_loss
            and entry.seed_max_above_mean <= SEED_SPREAD
        )
        report.append(Goal(min_ratio, max_loss, name, met))
    return report
