"""Bounded influence: magnitude-carrying results are normalised per tensor before averaging.

With bf16 or 2-bit values a result carries magnitudes, so one trainer sending finite but
huge values would otherwise decide the sign (DisTrO) or the size (SparseLoCo) of every
coefficient it chose. Before aggregation, each result's values of one tensor are rescaled
to a common root mean square:

    rms_r  = sqrt(fsum(v * v for v in result r's values of the tensor) / count)
    target = the lower median of rms_1 .. rms_R (the (R-1)//2-th smallest)
    v'     = v * (target / rms_r)          (0 when rms_r == 0)

(With `clip`, Templar's SparseLoCo rule: only results above the target are scaled down,
`v' = v * min(1, target / rms_r)`; a result below it keeps its own, smaller energy.)

Every result then carries the same energy per tensor (at most that, with `clip`): a typical result's, chosen by a
median that attackers cannot move while fewer than half of the results are theirs and too
large (the *lower* median stays at an honest value with 1 of 4 or 2 of 4 results huge). A
result may still concentrate its energy on a few of its coefficients, but it cannot exceed
one typical result's weight in the tensor. One-bit results are +-1 already and are left as
they are.

Determinism: every operation is a single IEEE-754 rounding of float64 numbers that all
clients hold bit-identically (elementwise products, `math.fsum`'s correctly rounded sum, one
division, one square root, one division per result), so every client computes the same
factors. NaN and infinity cannot arise: decoded values are finite (non-finite values are a
decode error, so such a result is refused by every client alike), a bf16 square (at most
~1.2e77) and any sum of them stay far inside float64, and `|v * target / rms_r|` is at
most `sqrt(count) * target`.

API: `value_rms(values) -> float`, `common_scale(rms) -> float`,
`influence_scales(rms, *, clip=False) -> list[float]`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def value_rms(values: np.ndarray) -> float:
    """Root mean square of one result's values of one tensor (float64), correctly rounded
    sum; raises `ValueError` on NaN or infinity (decode refuses such results first)."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size == 0:
        return 0.0
    if not np.isfinite(flat).all():
        raise ValueError("result values contain NaN or infinity")
    squares = np.multiply(flat, flat)
    return math.sqrt(math.fsum(squares.tolist()) / flat.size)


def common_scale(rms: Sequence[float]) -> float:
    """The lower median of the results' RMS values: the (R-1)//2-th smallest."""
    if not rms:
        raise ValueError("common_scale needs at least one result")
    ordered = sorted(rms)
    return ordered[(len(ordered) - 1) // 2]


def influence_scales(rms: Sequence[float], *, clip: bool = False) -> list[float]:
    """Per result, the factor that brings its RMS to `common_scale(rms)` (0 for a result
    whose values are all zero); with `clip`, only down to it (at most 1)."""
    target = common_scale(rms)
    scales = [target / value if value > 0.0 else 0.0 for value in rms]
    return [min(1.0, scale) for scale in scales] if clip else scales
