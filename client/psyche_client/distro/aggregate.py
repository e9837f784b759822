"""Exact, order-independent aggregation of many results' coefficients for one parameter.

All results' indices and values of a parameter are concatenated (results in the caller's
canonical order) and go through one float64 `scatter_add_` over the distinct chosen
coefficients, so the cost grows with the number of coefficients received; the dense
coefficient tensor is written once, for the inverse DCT.

The sums are exact. Every value is first rounded to a power-of-two grid fine enough that all
partial sums are integer multiples of the grid step below 2**53, which float64 adds without
rounding. A sum therefore does not depend on the order in which a kernel adds colliding
entries (CUDA's scatter uses atomics), and `sum / count` is one correctly rounded division
on every device. For +-1 values the grid changes nothing; for bf16 or 2-bit values it drops
only what lies about 2**-(52 - log2(results)) below the parameter's largest value.

`scales` (one factor per result, from `influence.influence_scales`) multiplies each result's
values first; the caller passes them for value kinds that carry magnitudes (bf16, 2-bit).

API: `exact_grid(values, terms) -> Tensor`, `aggregate_sparse(payloads, kind, totalk, *,
mean_over_all, device, scales=None) -> (positions, means)`, `aggregate(payloads, kind, chunks, totalk, *,
mean_over_all, device, scales=None) -> Tensor` (float64 `[chunks, totalk]`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from psyche_client.distro.result import TensorPayload
from psyche_client.distro.values import ValueKind


def exact_grid(values: torch.Tensor, terms: int) -> torch.Tensor:
    """`values` (float64) rounded so that any sum of `terms` of them is exact in float64."""
    if values.dtype != torch.float64:
        raise ValueError(f"exact_grid needs float64 values, got {values.dtype}")
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    if values.numel() == 0:
        return values
    peak = float(values.abs().max())
    if peak == 0.0:
        return values
    _, exponent = math.frexp(peak)  # peak < 2**exponent
    shift = 52 - exponent - math.ceil(math.log2(terms))
    scale = 2.0**shift
    return torch.round(values * scale) / scale


def aggregate_sparse(
    payloads: Sequence[TensorPayload],
    kind: ValueKind,
    totalk: int,
    *,
    mean_over_all: bool,
    device: torch.device,
    scales: Sequence[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(positions, means)`: the distinct chosen coefficients' flat positions
    (`chunk * totalk + index`, ascending, int64) and their float64 means, as `aggregate`
    defines them; coefficients no result chose are absent."""
    if not payloads:
        raise ValueError("aggregate needs at least one result")
    if scales is not None and len(scales) != len(payloads):
        raise ValueError(f"{len(scales)} scales for {len(payloads)} results")
    idx = np.concatenate([payload.indices() for payload in payloads], axis=1)
    if scales is None:
        val = np.concatenate([payload.values(kind) for payload in payloads], axis=1)
    else:
        val = np.concatenate(
            [
                np.multiply(payload.values(kind), scale)
                for payload, scale in zip(payloads, scales, strict=True)
            ],
            axis=1,
        )
    offsets = (np.arange(idx.shape[0], dtype=np.int64) * totalk)[:, None]
    flat = torch.from_numpy((idx + offsets).reshape(-1)).to(device)
    values = exact_grid(torch.from_numpy(val.reshape(-1)).to(device), len(payloads))
    positions, inverse = torch.unique(flat, sorted=True, return_inverse=True)
    sums = torch.zeros(positions.shape[0], dtype=torch.float64, device=device)
    sums.scatter_add_(0, inverse, values)
    if mean_over_all:
        return positions, sums / len(payloads)
    counts = torch.bincount(inverse, minlength=positions.shape[0])
    return positions, sums / counts.to(torch.float64)


def aggregate(
    payloads: Sequence[TensorPayload],
    kind: ValueKind,
    chunks: int,
    totalk: int,
    *,
    mean_over_all: bool,
    device: torch.device,
    scales: Sequence[float] | None = None,
) -> torch.Tensor:
    """Dense float64 coefficients `[chunks, totalk]` of one parameter from `payloads`.

    `mean_over_all=False`: each coefficient is the mean over the results that chose it (the
    reference's scatter-mean; coefficients no result chose stay 0). `True`: the sum divided
    by the number of results (an average in which a result that did not choose a
    coefficient counts as 0 there).

    The work before the dense output is sparse: the chosen coefficients' flat positions are
    sorted and made unique, sums and counts land in one scatter over the unique positions,
    and one indexed write fills the zeroed dense tensor. With `scales`, result r's values are
    multiplied by `scales[r]` (one float64 rounding each) before anything else.
    """
    positions, means = aggregate_sparse(
        payloads, kind, totalk, mean_over_all=mean_over_all, device=device, scales=scales
    )
    dense = torch.zeros(chunks * totalk, dtype=torch.float64, device=device)
    dense[positions] = means
    return dense.view(chunks, totalk)
