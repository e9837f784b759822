"""The witness quorum table (reference section 4.2)."""

from __future__ import annotations

WITNESS_QUORUM_RATIO = 2.0 / 3.0


def witness_quorum(witness_nodes: int, num_witnesses: int) -> int:
    """Witnesses needed for a quorum: 1, 2, 2 for 1..3, then `max(1, trunc(w * 2/3))`.

    `w` is `witness_nodes`, or `num_witnesses` when `witness_nodes == 0`. The reference panics
    for `w == 0`; we return 1 (no quorum can be met by zero witnesses), see docs/deviations.md.
    """
    w = witness_nodes if witness_nodes != 0 else num_witnesses
    if w <= 1:
        return 1
    if w <= 3:
        return 2
    return max(1, int(w * WITNESS_QUORUM_RATIO))
