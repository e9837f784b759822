"""Chunk sizes, DCT bases/transform and top-k/packing against the spec's test vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from psyche_client.distro import DctTransform, chunk_size, dct_basis, encoded_shape, num_chunks
from psyche_client.distro import compressor as compressor_module
from psyche_client.distro.compress import (
    index_bits,
    index_bytes,
    pack_bf16,
    pack_indices,
    pack_signs,
    topk_per_chunk,
    unpack_bf16,
    unpack_indices,
    unpack_signs,
)
from psyche_client.distro.compressor import Compressor
from psyche_client.distro.result import ResultLayout
from psyche_client.distro.values import ValueKind


@pytest.mark.parametrize(
    ("dim", "target", "expected"),
    [
        (12, 5, 4),
        (100, 7, 5),
        (100, 26, 25),
        (100, 101, 100),
        (1_000_000_007, 500_000_000, 1),
        (256, 64, 64),
        (32000, 64, 64),
        (4096, 64, 64),
        (11008, 64, 64),
        (688, 64, 43),
        (344, 64, 43),
        (256, 16, 16),
        (32000, 16, 16),
        (344, 16, 8),
        (100, 16, 10),
        (1, 64, 1),
        (64, 64, 64),
    ],
)
def test_chunk_size_reference_vectors(dim: int, target: int, expected: int) -> None:
    assert chunk_size(dim, target) == expected


@given(st.integers(1, 5000), st.integers(1, 200))
def test_chunk_size_is_largest_divisor_not_above_target(dim: int, target: int) -> None:
    chosen = chunk_size(dim, target)
    assert dim % chosen == 0
    if target >= dim:
        assert chosen == dim
    else:
        assert chosen <= target
        assert all(dim % d for d in range(chosen + 1, target + 1))


def test_chunk_size_rejects_empty_dimension() -> None:
    with pytest.raises(ValueError, match="size 0"):
        chunk_size(0, 64)


def test_encoded_shapes_follow_divisors() -> None:
    assert encoded_shape((688, 256), 64) == (16, 4, 43, 64)
    assert encoded_shape((256,), 64) == (4, 64)
    assert num_chunks((32000, 256), 64) == 2000
    assert num_chunks((11008, 4096), 64) == 11008


def test_dct_basis_n4_rows() -> None:
    basis = dct_basis(4)
    assert torch.allclose(
        basis[0], torch.tensor([0.5, 0.6533, 0.5, 0.2706], dtype=torch.float64), atol=1e-4
    )
    assert torch.allclose(
        basis[1], torch.tensor([0.5, 0.2706, -0.5, -0.6533], dtype=torch.float64), atol=1e-4
    )
    assert torch.allclose(basis @ basis.T, torch.eye(4, dtype=torch.float64), atol=1e-12)


def test_dct_basis_matches_closed_form() -> None:
    n = 7
    basis = dct_basis(n)
    for j in range(n):
        for k in range(n):
            c = math.sqrt((1 if k == 0 else 2) / n)
            assert basis[j, k].item() == pytest.approx(
                c * math.cos(math.pi * (2 * j + 1) * k / (2 * n)), abs=1e-12
            )


@pytest.mark.parametrize("shape", [(12, 16), (10,), (2, 6, 8)])
def test_identity_transform_only_cuts_tiles_out_exactly(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, dtype=torch.float32)
    plain = DctTransform(4, identity=True)
    encoded = plain.encode(x)
    assert tuple(encoded.shape) == DctTransform(4).encode(x).shape
    assert torch.equal(encoded.flatten().sort().values, x.flatten().sort().values)
    assert torch.equal(plain.decode(encoded, shape), x)


def test_encode_arange8_vector() -> None:
    transform = DctTransform(8)
    encoded = transform.encode(torch.arange(8, dtype=torch.float64))
    expected = torch.tensor(
        [9.8995, -6.4423, 0, -0.6735, 0, -0.2009, 0, -0.0507], dtype=torch.float64
    )
    assert encoded.shape == (1, 8)
    assert torch.allclose(encoded[0], expected, atol=1e-4)


def test_encode_matrix_is_separable_2d_dct_per_tile() -> None:
    torch.manual_seed(0)
    x = torch.randn(12, 8, dtype=torch.float64)
    transform = DctTransform(4)  # tiles 4 x 4
    encoded = transform.encode(x)
    assert encoded.shape == (3, 2, 4, 4)
    f = dct_basis(4)
    tile = x[4:8, 4:8]
    assert torch.allclose(encoded[1, 1], f.T @ tile @ f, atol=1e-12)


@pytest.mark.parametrize("shape", [(12, 8), (688, 256), (2, 6, 10), (100,), (64,), (7, 5)])
def test_decode_inverts_encode(shape: tuple[int, ...]) -> None:
    torch.manual_seed(1)
    x = torch.randn(shape, dtype=torch.float64)
    transform = DctTransform(64)
    restored = transform.decode(transform.encode(x), shape)
    assert torch.allclose(restored, x, atol=1e-10)


def test_decode_rejects_wrong_shape() -> None:
    with pytest.raises(ValueError, match="expected"):
        DctTransform(4).decode(torch.zeros(2, 2, 4, 4), (8, 12))


def test_topk_keeps_largest_magnitudes_with_sign() -> None:
    encoded = torch.tensor([[[[0.1, -5.0], [3.0, 0.2]]]])  # one 2x2 tile
    idx, val = topk_per_chunk(encoded, 2, tile_dims=2)
    assert sorted(idx[0].tolist()) == [1, 2]
    assert dict(zip(idx[0].tolist(), val[0].tolist(), strict=True)) == {1: -5.0, 2: 3.0}


def test_topk_clamps_k_to_tile() -> None:
    idx, _ = topk_per_chunk(torch.randn(3, 4), 10, tile_dims=1)
    assert idx.shape == (3, 4)


@pytest.mark.parametrize(
    ("totalk", "bits"),
    [(1, 0), (2, 1), (3, 2), (4, 2), (64, 6), (256, 8), (257, 9), (2752, 12), (4096, 12)],
)
def test_index_bits_is_ceil_log2(totalk: int, bits: int) -> None:
    assert index_bits(totalk) == bits


def test_index_packing_is_lsb_first_bit_stream() -> None:
    idx = torch.tensor([0, 1, 300, 4095])
    packed = pack_indices(idx, 4096)  # 12 bits each: 48 bits, 6 bytes
    assert packed == bytes([0x00, 0x10, 0x00, 0x2C, 0xF1, 0xFF])
    assert unpack_indices(packed, 4096, 4).tolist() == [0, 1, 300, 4095]
    # 6 bits each, 18 bits: 5 | 63 << 6 | 1 << 12, zero-padded to 3 bytes
    assert pack_indices(torch.tensor([5, 63, 1]), 64) == bytes([0xC5, 0x1F, 0x00])
    assert pack_indices(torch.tensor([0, 0, 0]), 1) == b""
    assert unpack_indices(b"", 1, 3).tolist() == [0, 0, 0]


def test_index_unpack_rejects_wrong_length_and_nonzero_padding() -> None:
    with pytest.raises(ValueError, match="exactly 3 indices"):
        unpack_indices(bytes(4), 64, 3)
    with pytest.raises(ValueError, match="padding"):
        unpack_indices(bytes([0xC5, 0x1F, 0x04]), 64, 3)


@pytest.mark.parametrize("totalk", [2**25, 2**25 + 1, 2**26 + 3, 2**32])
def test_index_packing_roundtrip_wide_indices(totalk: int) -> None:
    """Widths above 25 bits take the bit-by-bit path; both paths must agree."""
    idx = torch.tensor([0, totalk - 1, 12345, totalk // 2, 1, totalk - 2, 7])
    packed = pack_indices(idx, totalk)
    assert unpack_indices(packed, totalk, len(idx)).tolist() == idx.tolist()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 70_000), st.integers(0, 200), st.integers(0, 2**31))
def test_index_packing_roundtrip(totalk: int, count: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, totalk, (count,), generator=gen)
    packed = pack_indices(idx, totalk)
    assert len(packed) == index_bytes(count, totalk)
    assert unpack_indices(packed, totalk, count).tolist() == idx.tolist()


def test_sign_packing_lsb_first_and_plus_zero_is_plus_one() -> None:
    val = torch.tensor([-1.0, 2.0, 0.0, -0.0, 3.0, 4.0, 5.0, 6.0, -7.0])
    packed = pack_signs(val)
    # bits (LSB first): 1,0,0,1,0,0,0,0 | 1 -> 0b00001001, 0b00000001
    assert packed == bytes([0b00001001, 0b00000001])
    signs = unpack_signs(packed, 9)
    assert signs.tolist() == [-1, 1, 1, -1, 1, 1, 1, 1, -1]


def test_sign_unpack_rejects_nonzero_padding_and_wrong_length() -> None:
    with pytest.raises(ValueError, match="padding"):
        unpack_signs(bytes([0b10000000]), 3)
    with pytest.raises(ValueError, match="exactly"):
        unpack_signs(bytes(2), 3)


def test_bf16_packing_roundtrip() -> None:
    val = torch.tensor([1.5, -2.25, 3e-3], dtype=torch.float32)
    packed = pack_bf16(val)
    assert len(packed) == 6
    assert packed[:2] == np.array([0x3FC0], dtype="<u2").tobytes()  # 1.5 in bf16
    assert torch.equal(unpack_bf16(packed), val.to(torch.bfloat16))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([2, 3, 4]), st.integers(0, 2**31))
def test_full_topk_roundtrip_is_lossless(rows: int, cols: int, chunk: int, seed: int) -> None:
    """decode(encode(x)) == x when top-k covers the whole tile."""
    gen = torch.Generator().manual_seed(seed)
    shape = (rows * chunk, cols * chunk)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    transform = DctTransform(chunk)
    encoded = transform.encode(x)
    idx, val = topk_per_chunk(encoded, chunk * chunk, tile_dims=2)
    dense = torch.zeros(idx.shape[0], chunk * chunk, dtype=torch.float64)
    dense.scatter_(-1, idx, val)
    restored = transform.decode(dense.view(encoded.shape), shape)
    assert torch.allclose(restored, x, atol=1e-10)


@pytest.mark.parametrize(
    ("shape", "chunk", "topk", "one_bit", "payload"),
    [
        ((32000, 256), 64, 8, True, 26_000),  # 16,000 x 12 bits + 16,000 bits
        ((32000, 256), 64, 8, False, 56_000),
        ((32000, 256), 16, 4, False, 384_000),  # 8-bit indices: as the reference
        ((256, 256), 64, 8, True, 208),
        ((768, 256), 64, 8, False, 1_344),
        ((256,), 64, 8, True, 28),  # 32 x 6 bits + 32 bits
        ((4096, 4096), 64, 8, True, 53_248),
        ((11008, 4096), 64, 8, True, 143_104),
        ((688, 256), 64, 8, True, 832),  # 43 x 64 tiles: 2,752 coefficients, 12 bits
    ],
)
def test_payload_formula_table(
    shape: tuple[int, ...], chunk: int, topk: int, one_bit: bool, payload: int
) -> None:
    kind = ValueKind.ONE_BIT if one_bit else ValueKind.BF16
    layout = ResultLayout.for_parameters([("w", shape)], chunk, topk, kind)
    assert layout.payload_bytes() == payload


def test_blocked_encode_selects_what_one_pass_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large matrices are encoded over blocks of tile rows (3-D ones with their leading dims
    folded in); the chunks, indices and values are those of one pass."""
    monkeypatch.setattr(compressor_module, "_ENCODE_BLOCK", 8 * 24)
    gen = torch.Generator().manual_seed(3)
    for shape in ((40, 24), (3, 16, 24)):
        comp = Compressor([("w", shape)], 8, 5, ValueKind.ONE_BIT)
        buffer = torch.randn(shape, generator=gen)
        got = comp.compress(0, buffer)
        idx, val = topk_per_chunk(DctTransform(8).encode(buffer), 5, 2)
        assert torch.equal(got.idx, idx)
        torch.testing.assert_close(got.val, val, rtol=0, atol=1e-6)
