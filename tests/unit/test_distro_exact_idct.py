"""The integer inverse DCT behind DisTrO's apply: exactly its definition, on every path.

`ExactSignDecoder.signs` must equal sign(B1_int @ X_int @ B2_int.T) computed with Python
integers (the definition in `exact_idct`), whatever the float32 path (sparse or dense first
stage, thread count, summation order), at exact ties too; and it may differ from the float64
DCT's sign only where |G| is within the proven rounding of X and the basis.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from psyche_client.distro import exact_idct
from psyche_client.distro.dct import DctTransform, dct_basis
from psyche_client.distro.exact_idct import P_BITS, Q_BITS, ExactSignDecoder, integer_basis
from psyche_client.distro.result import ResultLayout, TensorLayout
from psyche_client.distro.values import ValueKind

from tests.support.exact_idct_reference import integer_sign_definition as _definition

CPU = torch.device("cpu")


def _layout(shape: tuple[int, ...], chunk: int = 8) -> TensorLayout:
    return ResultLayout.for_parameters([("w", shape)], chunk, 4, ValueKind.ONE_BIT).tensors[0]


def _random_coefficients(
    layout: TensorLayout, per_chunk: int, seed: int, one_bit: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = np.random.default_rng(seed)
    chosen = [
        c * layout.totalk + np.sort(gen.choice(layout.totalk, per_chunk, replace=False))
        for c in range(layout.chunks)
    ]
    positions = torch.from_numpy(np.concatenate(chosen).astype(np.int64))
    if one_bit:  # scatter-means of +-1 over up to 4 results: s / c
        counts = gen.integers(1, 5, positions.numel())
        sums = np.array([gen.choice(np.arange(-c, c + 1, 2)) for c in counts])
        means = torch.from_numpy(sums / counts)
    else:
        means = torch.from_numpy(gen.standard_normal(positions.numel()) * 1e-3)
    return positions, means


@pytest.mark.parametrize(
    ("shape", "per_chunk", "one_bit"),
    [((16, 24), 3, True), ((16, 24), 40, True), ((16, 24), 20, False), ((24,), 3, True)],
    ids=["sparse-1bit", "dense-1bit", "bf16-values", "vector"],
)
def test_signs_equal_the_integer_definition(
    shape: tuple[int, ...], per_chunk: int, one_bit: bool
) -> None:
    layout = _layout(shape)
    for seed in range(3):
        positions, means = _random_coefficients(layout, per_chunk, seed, one_bit)
        got = ExactSignDecoder().signs(positions, means, layout, CPU)
        assert got.dtype == torch.float32 and tuple(got.shape) == shape
        np.testing.assert_array_equal(got.numpy(), _definition(layout, positions, means))


def test_exact_ties_give_zero_through_the_exact_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """X[1, 0] = +1 and X[0, 1] = -1 give G[a, b] = B[a,1] B[b,0] - B[a,0] B[b,1]: exactly 0
    on the diagonal. Those entries must go through the exact path and come out 0."""
    layout = _layout((8, 8))
    positions = torch.tensor([1, 8], dtype=torch.int64)  # (j=0, k=1) and (j=1, k=0)
    means = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    asked: list[int] = []
    real = exact_idct._exact_entries

    def spy(where: np.ndarray, *args: object) -> np.ndarray:
        asked.append(len(where))
        return real(where, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(exact_idct, "_exact_entries", spy)
    got = ExactSignDecoder().signs(positions, means, layout, CPU).numpy()
    np.testing.assert_array_equal(got, _definition(layout, positions, means))
    assert (np.diag(got) == 0).all()
    assert (got[~np.eye(8, dtype=bool)] != 0).all()
    assert asked and asked[0] >= 8


def test_same_signs_on_sparse_and_dense_paths_blocks_and_any_thread_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Different float32 summation orders (index_add_ vs a GEMM, 1 vs 2 threads) and block
    sizes cannot change the result, and it is the definition's."""
    layout = _layout((256, 128), chunk=64)
    positions, means = _random_coefficients(layout, 64, 7)
    results = []
    threads = torch.get_num_threads()
    try:
        for per_tile, n_threads, block in ((10**9, 1, 1 << 18), (0, 1, 1), (0, 2, 1 << 18)):
            monkeypatch.setattr(exact_idct, "_SPARSE_PER_TILE", per_tile)
            monkeypatch.setattr(exact_idct, "_BLOCK_ELEMENTS", block)
            torch.set_num_threads(n_threads)
            results.append(ExactSignDecoder().signs(positions, means, layout, CPU))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert torch.equal(results[0], other)
    np.testing.assert_array_equal(results[0].numpy(), _definition(layout, positions, means))


def test_signs_match_float64_except_within_the_proven_rounding() -> None:
    """Against the float64 inverse DCT: a sign may differ only where |G| is below the rounding
    of X (2**-(P+1) of the peak's power of two per coefficient) and of the basis (2**-(Q+1))."""
    layout = _layout((128, 192), chunk=64)
    n = 64
    beta = float(dct_basis(n).abs().max()) + 2.0**-Q_BITS
    transform = DctTransform(64)
    checked = 0
    for seed in range(4):
        positions, means = _random_coefficients(layout, 32, seed)
        got = ExactSignDecoder().signs(positions, means, layout, CPU)
        dense = torch.zeros(layout.chunks * layout.totalk, dtype=torch.float64)
        dense[positions] = means
        ref = transform.decode(dense.view(layout.xshape), layout.shape)
        _, exponent = math.frexp(float(means.abs().max()))
        l1 = torch.zeros(layout.chunks, dtype=torch.float64)
        l1.index_add_(0, positions // layout.totalk, means.abs())
        count = torch.bincount(positions // layout.totalk, minlength=layout.chunks)
        per_tile = (
            l1 * 2 * beta * 2.0 ** -(Q_BITS + 1)
            + count * 2.0 ** (exponent - P_BITS - 1) * beta**2
            + 1e-12
        )
        tiles = per_tile.view(2, 1, 3, 1).expand(2, 64, 3, 64).reshape(128, 192)
        differ = torch.sign(ref).float() != got
        assert (ref.abs()[differ] <= tiles[differ]).all()
        checked += int((ref.abs() > tiles).sum())
    assert checked > 0.99 * 4 * 128 * 192


def test_no_coefficients_or_all_zero_give_no_update() -> None:
    layout = _layout((16, 16))
    empty = torch.zeros(0, dtype=torch.int64)
    zeros = ExactSignDecoder().signs(empty, torch.zeros(0, dtype=torch.float64), layout, CPU)
    assert not zeros.any()
    some = torch.tensor([3, 70], dtype=torch.int64)
    assert (
        not ExactSignDecoder().signs(some, torch.zeros(2, dtype=torch.float64), layout, CPU).any()
    )


@pytest.mark.parametrize("n", [1, 2, 3, 8, 43, 64, 96, 128, 256])
def test_integer_basis_is_far_from_rounding_ties(n: int) -> None:
    """The basis integers do not depend on the last bits of the cosines of a machine."""
    scaled = dct_basis(n).numpy() * 2.0**Q_BITS
    assert (np.abs(scaled - np.floor(scaled) - 0.5) > 1e-6).all() or n == 1
    assert np.array_equal(integer_basis(n), np.rint(scaled).astype(np.int64))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_signs_equal_the_cpu_signs() -> None:
    """Another device's kernels (atomics in index_add_, other GEMM orders) give the same."""
    layout = _layout((256, 128), chunk=64)
    for per_chunk in (16, 200):
        positions, means = _random_coefficients(layout, per_chunk, 11)
        cpu = ExactSignDecoder().signs(positions, means, layout, CPU)
        cuda = ExactSignDecoder().signs(positions, means, layout, torch.device("cuda"))
        assert torch.equal(cpu, cuda.cpu())


def test_python_integer_fallback_agrees_with_the_wrapping_one() -> None:
    """The exact path's Python-integer variant (taken if a bound came near 2**62) gives the
    signs of the wrapping one, which is exact for the small |G_int| it is used for."""
    layout = _layout((16, 24))
    positions, _ = _random_coefficients(layout, 20, 5)
    x_int = torch.randint(
        -100, 101, (positions.numel(),), generator=torch.Generator().manual_seed(2)
    )
    decoder = ExactSignDecoder()
    where = np.array(
        [[r, a, c, b] for r in range(2) for a in range(8) for c in range(3) for b in (0, 5)]
    )
    args = (positions, x_int, 3, 8, 8, decoder.basis(8), decoder.basis(8))
    wrapped = exact_idct._exact_entries(where, *args, False)
    wide = exact_idct._exact_entries(where, *args, True)
    assert np.array_equal(np.sign(wrapped), wide)
    assert (wrapped != 0).sum() > 0.9 * len(where)
