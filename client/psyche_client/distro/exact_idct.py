"""The hardware-independent sign of the inverse DCT of aggregated coefficients (DisTrO apply).

`sign(G)` is the update, and `G` is the only value of `apply` whose float sums would depend on
the device (matmul kernels add in different orders), so it is defined on integers:

    X_int = round(X * 2**(P - e))       e: the aggregate's peak |X| is below 2**e; |X_int| <= 2**P
    B_int = round(F * 2**Q)             F: the orthonormal DCT-II basis (`dct.dct_basis`)
    G_int = B1_int @ X_int @ B2_int.T   per tile; the update is sign(G_int), sign(0) = 0

with P = Q = 22 and round-half-even. `X` is the float64 aggregate (`aggregate_sparse`: exact
sums, one correctly rounded division), and scaling by a power of two and rounding are exact
operations, so `X_int` is the same integer everywhere. `B_int` is computed once on the CPU
from float64 cosines; no entry lies within 1e-6 of a rounding tie (checked when it is built),
so a cosine one ulp off on another machine gives the same integers. `G_int` is an exact
integer, so `sign(G_int)` is a function of the results alone.

Computing it: one float32 transform in two matmul stages (the first sparse, `index_add_` over
the received coefficients, when a tile holds few of them; dense otherwise), on integer-valued
float32 inputs (|X_int|, |B_int| <= 2**22 are exact in float32). For every order of
summation, with or without FMA, float32's error is at most

    |G~ - G_int| <= (g(n2) + g(n1) (1 + g(n2))) * max|B1_int| * max|B2_int| * sum_tile |X_int|

with g(n) = n u / (1 - n u), u = 2**-24 (the standard dot-product bound, applied to each
stage), inflated by 2**-20 for the rounding of the bound itself. Where |G~| exceeds its tile's
bound, sign(G~) = sign(G_int) on every device. The few other entries (|G~| within about 1e-5
of the tile's scale; a few thousand of 134M for 4 results) are recomputed exactly: G_int as a
sum over the tile's nonzero coefficients of `B1_int[a, j] * X_int[j, k] * B2_int[b, k]` in
wrapping 64-bit integer arithmetic, which is exact modulo 2**64; those entries satisfy
|G_int| <= 2 * bound < 2**62, so the wrapped value is G_int itself. TF32 and reduced-precision
float32 matmuls are switched off for the duration of the call (their error is not the bound's).

Against the real-number DCT of X, sign(G_int) differs only where |G| is below the rounding of
X and F to those grids (about 2**-21 of the tile's peak coefficient times the coefficients'
count; `tests/unit/test_distro_exact_idct.py` checks this against float64).

API: `integer_basis(n) -> np.ndarray`, `ExactSignDecoder()` with
`.signs(positions, means, layout, device) -> Tensor` (float32 in the parameter's shape),
`P_BITS`, `Q_BITS`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from psyche_client.distro.dct import dct_basis
from psyche_client.distro.result import TensorLayout

P_BITS = 22
Q_BITS = 22
_U = 2.0**-24
_TIE_MARGIN = 1e-6
# below this many received coefficients per tile the first stage is sparse (index_add_)
_SPARSE_PER_TILE = 96
_BLOCK_ELEMENTS = 1 << 18


def integer_basis(n: int) -> np.ndarray:
    """`round(F * 2**Q_BITS)` as int64 `[n, n]`; raises if an entry is near a rounding tie."""
    scaled = dct_basis(n, dtype=torch.float64).numpy() * 2.0**Q_BITS
    frac = np.abs(scaled - np.floor(scaled) - 0.5)
    if n > 1 and float(frac.min()) < _TIE_MARGIN:
        raise ValueError(f"the integer DCT basis of size {n} has an entry near a rounding tie")
    return np.rint(scaled).astype(np.int64)


def _gamma(n: int) -> float:
    return n * _U / (1.0 - n * _U)


@contextmanager
def _full_fp32_matmul() -> Iterator[None]:
    """Plain IEEE float32 matmuls (no TF32, no bf16 passes) inside the block."""
    precision = torch.get_float32_matmul_precision()
    cuda_tf32 = torch.backends.cuda.matmul.allow_tf32
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cuda.matmul.allow_tf32 = cuda_tf32
        torch.backends.cudnn.allow_tf32 = cudnn_tf32


class _Basis:
    """One basis size: the integers (CPU int64 and uint64 for the exact path), its largest
    magnitude, and float32 copies per device."""

    def __init__(self, n: int) -> None:
        self.ints = integer_basis(n)
        self.wrapping = self.ints.astype(np.uint64)
        self.peak = int(np.abs(self.ints).max())
        self._float: dict[torch.device, torch.Tensor] = {}

    def float32(self, device: torch.device) -> torch.Tensor:
        cached = self._float.get(device)
        if cached is None:
            cached = torch.from_numpy(self.ints).to(device=device, dtype=torch.float32)
            self._float[device] = cached
        return cached


class ExactSignDecoder:
    """`sign(G_int)` of one parameter's aggregate; bases cached per size (no global state)."""

    def __init__(self) -> None:
        self._bases: dict[int, _Basis] = {}

    def basis(self, n: int) -> _Basis:
        cached = self._bases.get(n)
        if cached is None:
            cached = self._bases[n] = _Basis(n)
        return cached

    @torch.no_grad()
    def signs(
        self,
        positions: torch.Tensor,
        means: torch.Tensor,
        layout: TensorLayout,
        device: torch.device,
    ) -> torch.Tensor:
        """float32 -1/0/+1 in `layout.shape`: the sign of the integer inverse DCT of the
        coefficients `means` (float64) at the sorted, distinct flat `positions` (tile-major,
        `tile * totalk + index`)."""
        grid, n1, n2 = _tile_grid(layout)
        rows, cols = grid
        tiles = rows * cols
        if positions.numel() == 0:
            return torch.zeros(layout.shape, dtype=torch.float32, device=device)
        peak = float(means.abs().max())
        if peak == 0.0:
            return torch.zeros(layout.shape, dtype=torch.float32, device=device)
        _, exponent = math.frexp(peak)
        x_int = torch.round(means * 2.0 ** (P_BITS - exponent)).to(torch.int64)
        positions = positions.to(device)
        x_int = x_int.to(device)
        b1, b2 = self.basis(n1), self.basis(n2)
        tile = torch.div(positions, n1 * n2, rounding_mode="floor")
        within = positions - tile * (n1 * n2)
        j = torch.div(within, n2, rounding_mode="floor")
        k = within - j * n2
        l1 = torch.zeros(tiles, dtype=torch.int64, device=device)
        l1.index_add_(0, tile, x_int.abs())
        kappa = (_gamma(n2) + _gamma(n1) * (1.0 + _gamma(n2))) * (1.0 + 2.0**-20)
        bound64 = l1.to(torch.float64) * (kappa * b1.peak * b2.peak)
        wide = 2.0 * float(bound64.max()) >= 2.0**62
        # a tile without coefficients is exactly 0: give it a bound no |G~| is below
        bound = torch.where(l1 > 0, bound64, -1.0).to(torch.float32).view(rows, 1, cols, 1)
        out = torch.empty((rows, n1, cols, n2), dtype=torch.float32, device=device)
        # blocks of tile rows, so that each block's passes stay in cache
        step = max(1, _BLOCK_ELEMENTS // (n1 * cols * n2))
        tile_row = torch.div(tile, cols, rounding_mode="floor")
        edges = torch.searchsorted(
            tile_row, torch.arange(0, rows + step, step, device=device).clamp_(max=rows)
        ).tolist()
        unsure = []
        with _full_fp32_matmul():
            for block, first in enumerate(range(0, rows, step)):
                count = min(step, rows - first)
                part = slice(edges[block], edges[block + 1])
                # stage 1 in [rows, n1, cols, n2] (tile row r, j, tile col c, b), so that the
                # second stage, B1 @ [n1, cols * n2] per tile row, lands in the parameter's
                # layout
                line = ((tile_row[part] - first) * n1 + j[part]) * cols + (
                    tile[part] - tile_row[part] * cols
                )
                stage1 = self._first_stage(line, k[part], x_int[part], count, n1, cols, n2, b2)
                approx = torch.matmul(b1.float32(device), stage1.view(count, n1, cols * n2))
                shaped = approx.view(count, n1, cols, n2)
                torch.sign(shaped, out=out[first : first + count])
                found = (shaped.abs_() <= bound[first : first + count]).nonzero()
                if found.shape[0]:
                    found[:, 0] += first
                    unsure.append(found)
        if unsure:
            where = torch.cat(unsure)
            exact = _exact_entries(
                where.cpu().numpy(), positions, x_int, cols, n1, n2, b1, b2, wide
            )
            out[where[:, 0], where[:, 1], where[:, 2], where[:, 3]] = torch.from_numpy(
                np.sign(exact).astype(np.float32)
            ).to(device)
        return out.reshape(layout.shape)

    def _first_stage(
        self,
        line: torch.Tensor,
        k: torch.Tensor,
        x_int: torch.Tensor,
        rows: int,
        n1: int,
        cols: int,
        n2: int,
        b2: _Basis,
    ) -> torch.Tensor:
        """`X_int @ B2_int.T` per tile as float32 `[rows * n1 * cols, n2]`; coefficient i
        lies in row `line[i]` (`(r * n1 + j) * cols + c` for row j of tile (r, c)), column
        `k[i]`."""
        device = x_int.device
        basis_t = b2.float32(device).t().contiguous()  # row k: B2_int[:, k]
        x_float = x_int.to(torch.float32)
        if x_int.numel() < _SPARSE_PER_TILE * rows * cols:
            out = torch.zeros(rows * n1 * cols, n2, dtype=torch.float32, device=device)
            out.index_add_(0, line, basis_t[k] * x_float[:, None])
            return out
        dense = torch.zeros(rows * n1 * cols * n2, dtype=torch.float32, device=device)
        dense[line * n2 + k] = x_float
        return dense.view(-1, n2) @ basis_t


def _tile_grid(layout: TensorLayout) -> tuple[tuple[int, int], int, int]:
    """`((tile rows, tile cols), n1, n2)`: matrices by their tiles (leading dims folded into
    the rows), vectors as `chunks x 1` tiles of `1 x n`."""
    xshape = layout.xshape
    if layout.tile_dims == 2:
        *lead, rows_over, cols_over, n1, n2 = xshape
        return (math.prod(lead) * rows_over, cols_over), n1, n2
    chunks, n = xshape
    return (chunks, 1), 1, n


def _exact_entries(
    where: np.ndarray,
    positions: torch.Tensor,
    x_int: torch.Tensor,
    cols: int,
    n1: int,
    n2: int,
    b1: _Basis,
    b2: _Basis,
    wide: bool,
) -> np.ndarray:
    """G_int at the entries `where` (`[m, 4]`: tile row, a, tile col, b), exactly: the sum
    over the tile's coefficients in wrapping uint64 arithmetic, read back as int64 (exact
    while |G_int| < 2**63). `wide`: Python integers instead, and only the signs."""
    pos = positions.cpu().numpy()
    x_cpu = x_int.cpu().numpy()
    totalk = n1 * n2
    tile_of = pos // totalk
    entry_tile = where[:, 0] * cols + where[:, 2]
    starts = np.searchsorted(tile_of, entry_tile, side="left")
    ends = np.searchsorted(tile_of, entry_tile, side="right")
    counts = ends - starts
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(where)), counts)
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    coef = np.repeat(starts, counts) + offsets
    within = pos[coef] - tile_of[coef] * totalk
    j, k = within // n2, within % n2
    a, b = where[owner, 1], where[owner, 3]
    segments = np.cumsum(counts) - counts  # every entry's tile holds a coefficient
    if not wide:
        with np.errstate(over="ignore"):
            x_wrap = x_cpu[coef].astype(np.uint64)  # two's complement, wraps exactly
            terms = b1.wrapping[a, j] * x_wrap * b2.wrapping[b, k]
            return np.add.reduceat(terms, segments).view(np.int64)
    terms_obj = (
        b1.ints[a, j].astype(object) * x_cpu[coef].astype(object) * b2.ints[b, k].astype(object)
    )
    return np.sign(np.add.reduceat(terms_obj, segments).astype(object)).astype(np.int64)
