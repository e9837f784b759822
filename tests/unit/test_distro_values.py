"""Value kinds: the 2-bit quantizer's grid and byte layout, strict decoding of value bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from psyche_client.distro.values import ValueKind, dequantize, quantize, value_bytes


def test_two_bit_layout_scale_then_sign_and_level_bits() -> None:
    val = torch.tensor([[0.9, -0.2, 0.5, -1.0]])
    packed, sent = quantize(val, ValueKind.TWO_BIT)
    # scale max|v| = 1.0 as bf16 (0x3F80, little-endian), then codes (sign, full) per value:
    # (0,1) (1,0) (0,0) (1,1) -> bits 1, 2, 6, 7 -> 0b11000110
    assert packed == bytes([0x80, 0x3F, 0b11000110])
    third = 1.0 / 3.0
    assert torch.equal(sent, torch.tensor([[1.0, -third, third, -1.0]]))
    assert dequantize(packed, ValueKind.TWO_BIT, 1, 4).tolist() == [[1.0, -third, third, -1.0]]


def test_two_bit_scale_is_per_chunk_and_zero_chunks_stay_zero() -> None:
    val = torch.tensor([[0.0, 0.0], [3.0, -0.25], [-8.0, 7.0]])
    packed, _ = quantize(val, ValueKind.TWO_BIT)
    assert len(packed) == value_bytes(ValueKind.TWO_BIT, 3, 2) == 6 + 2
    values = dequantize(packed, ValueKind.TWO_BIT, 3, 2)
    assert values.tolist() == [[0.0, 0.0], [3.0, -1.0], [-8.0, 8.0]]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(0, 2**31))
def test_receivers_read_what_the_sender_reports_as_sent(chunks: int, k: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    val = torch.randn(chunks, k, generator=gen, dtype=torch.float64) * 10.0 ** (seed % 7 - 3)
    for kind in ValueKind:
        packed, sent = quantize(val, kind)
        assert len(packed) == value_bytes(kind, chunks, k)
        read = dequantize(packed, kind, chunks, k)
        assert np.array_equal(read, sent.numpy()), kind
        if kind == ValueKind.TWO_BIT:  # nearest level of {s/3, s}: error at most s/3
            scale = val.abs().amax(dim=-1, keepdim=True)
            assert bool(((sent - val).abs() <= scale / 3 * 1.01 + 1e-300).all())
            assert bool((torch.sign(sent) == torch.sign(val)).all())


def test_one_bit_reads_plus_one_for_plus_zero_and_bf16_rounds() -> None:
    val = torch.tensor([[0.0, -0.0, 2.0, -3.0]])
    _, sent = quantize(val, ValueKind.ONE_BIT)
    assert sent.tolist() == [[1.0, -1.0, 1.0, -1.0]]
    _, sent = quantize(torch.tensor([[1.0 + 2**-10]]), ValueKind.BF16)
    assert sent.item() == 1.0


def test_two_bit_decoding_is_strict() -> None:
    good, _ = quantize(torch.tensor([[0.9, -0.2, 0.5]]), ValueKind.TWO_BIT)
    with pytest.raises(ValueError, match="exactly 3 values"):
        dequantize(good + b"\0", ValueKind.TWO_BIT, 1, 3)
    with pytest.raises(ValueError, match="padding"):
        dequantize(good[:2] + bytes([good[2] | 0x80]), ValueKind.TWO_BIT, 1, 3)
    negative = bytes([0x80, 0xBF]) + good[2:]  # -1.0 in bf16
    with pytest.raises(ValueError, match="must not be negative"):
        dequantize(negative, ValueKind.TWO_BIT, 1, 3)
    minus_zero = bytes([0x00, 0x80]) + good[2:]
    with pytest.raises(ValueError, match="must not be negative"):
        dequantize(minus_zero, ValueKind.TWO_BIT, 1, 3)
    nan = bytes([0xC0, 0x7F]) + good[2:]
    with pytest.raises(ValueError, match="NaN"):
        dequantize(nan, ValueKind.TWO_BIT, 1, 3)
    with pytest.raises(ValueError, match="NaN"):
        dequantize(bytes([0xC0, 0x7F]), ValueKind.BF16, 1, 1)


def test_codebook_layout_mean_and_std_then_codes() -> None:
    val = torch.tensor([[1.0, -3.0, 3.0, -1.0]])
    packed, sent = quantize(val, ValueKind.TWO_BIT_CODEBOOK)
    # magnitudes 1, 3, 3, 1: mean 2.0 (bf16 0x4000), std 1.0 (0x3F80); levels lo 1, hi 3;
    # codes (sign, high): (0,0) (1,1) (0,1) (1,0) -> bits 2, 3, 5, 6 -> 0b01101100
    assert packed == bytes([0x00, 0x40, 0x80, 0x3F, 0b01101100])
    assert sent.tolist() == [[1.0, -3.0, 3.0, -1.0]]
    assert dequantize(packed, ValueKind.TWO_BIT_CODEBOOK, 1, 4).tolist() == sent.tolist()


def test_codebook_low_level_never_crosses_zero() -> None:
    val = torch.tensor([[0.0, 0.0, 0.0, 8.0]])  # mean 2, std 2*sqrt(3): mean - std < 0
    packed, sent = quantize(val, ValueKind.TWO_BIT_CODEBOOK)
    assert sent[0, :3].tolist() == [0.0, 0.0, 0.0]
    assert sent[0, 3].item() > 5.0
    assert np.array_equal(dequantize(packed, ValueKind.TWO_BIT_CODEBOOK, 1, 4), sent.numpy())


def test_four_bit_layout_scale_then_sign_and_three_level_bits() -> None:
    val = torch.tensor([[1.0, -0.5, 0.01]])
    packed, sent = quantize(val, ValueKind.FOUR_BIT)
    # scale 1.0; levels (m + 1) / 8: 1.0 -> m 7 (sign 0), -0.5 -> m 3 (sign 1), 0.01 -> m 0
    # value j at bits 4j (sign) and 4j + 1.. (m, LSB first): 0b1110 | 0b0111 << 4, then 0b0000
    assert packed == bytes([0x80, 0x3F, 0b01111110, 0b00000000])
    assert sent.tolist() == [[1.0, -0.5, 0.125]]


def test_codebook_and_four_bit_fit_top_k_values_closer_than_the_uniform_two_bit() -> None:
    gen = torch.Generator().manual_seed(3)
    dense = torch.randn(64, 4096, generator=gen, dtype=torch.float64)
    kept = dense.gather(-1, dense.abs().topk(64, dim=-1).indices)  # what top-k sends

    def error(kind: ValueKind) -> float:
        return float(((quantize(kept, kind)[1] - kept).norm() / kept.norm()) ** 2)

    assert error(ValueKind.TWO_BIT_CODEBOOK) < 0.5 * error(ValueKind.TWO_BIT)
    assert error(ValueKind.FOUR_BIT) < error(ValueKind.TWO_BIT_CODEBOOK)


@pytest.mark.parametrize("kind", [ValueKind.TWO_BIT_CODEBOOK, ValueKind.FOUR_BIT])
def test_codebook_and_four_bit_decoding_is_strict(kind: ValueKind) -> None:
    good, _ = quantize(torch.tensor([[0.9, -0.2, 0.5]]), kind)
    head = 4 if kind == ValueKind.TWO_BIT_CODEBOOK else 2
    with pytest.raises(ValueError, match="exactly 3 values"):
        dequantize(good + b"\0", kind, 1, 3)
    with pytest.raises(ValueError, match="padding"):
        dequantize(good[:-1] + bytes([good[-1] | 0x80]), kind, 1, 3)
    with pytest.raises(ValueError, match="must not be negative"):
        dequantize(bytes([0x80, 0xBF]) + good[2:], kind, 1, 3)
    with pytest.raises(ValueError, match="NaN"):
        dequantize(good[: head - 2] + bytes([0xC0, 0x7F]) + good[head:], kind, 1, 3)
