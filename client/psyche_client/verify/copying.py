"""A copied result, told by its top-k positions.

`index_overlap` is the share of one result's chosen positions (parameter, chunk, index) that
another result also chose. Two honest trainers of one round pick their top-k from different
momenta and overlap little; a result re-announced from another trainer's (a copier, or a free
rider relabelling a peer's work) overlaps it fully, whatever values it sends. The check needs
only the two results' bytes, which every client downloads to apply them, so every verifier
that holds both reaches the same verdict (docs/verification.md).

The threshold is `verify.threshold.COPY_OVERLAP`, measured by bench/verification.py.

Pure numpy on index arrays; no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def index_overlap(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """Share of `a`'s chosen positions that `b` chose too, in [0, 1].

    `a` and `b` are per-parameter `[chunks, k]` index arrays of one layout; the order of the
    indices within a chunk does not matter. Raises `ValueError` when the layouts differ."""
    if len(a) != len(b):
        raise ValueError(f"results have {len(a)} and {len(b)} tensors")
    shared = 0
    total = 0
    for left, right in zip(a, b, strict=True):
        if left.shape != right.shape:
            raise ValueError(f"index shapes {left.shape} and {right.shape} differ")
        if left.size == 0:
            continue
        ls = np.sort(left, axis=-1)
        rs = np.sort(right, axis=-1)
        # per chunk: how many of left's indices appear in right's (k is small: a k x k compare)
        shared += int((ls[:, :, None] == rs[:, None, :]).any(axis=-1).sum())
        total += int(left.size)
    return shared / total if total else 0.0
