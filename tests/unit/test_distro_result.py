"""The binary result format: round trip, sizes vs the section 1.10 formula, commitment,
and strict rejection of corrupted or mis-shaped results."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from psyche_client.distro import (
    DistroOptimizer,
    DistroResult,
    DistroSettings,
    ResultDecodeError,
    ResultLayout,
    TensorPayload,
    ValueKind,
)
from psyche_client.distro.compress import pack_indices
from psyche_common.batch_id import BatchId

from tests.support.tiny_distro import SETTINGS, generate_result

ONE_BIT = dataclasses.replace(SETTINGS, quantize_1bit=True)
TWO_BIT = dataclasses.replace(SETTINGS, quantize_2bit=True)


def llama_shapes(hidden: int, intermediate: int, layers: int, heads: int, vocab: int) -> list:
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


@pytest.mark.parametrize("settings", [SETTINGS, ONE_BIT, TWO_BIT], ids=["bf16", "1bit", "2bit"])
def test_roundtrip(settings: DistroSettings) -> None:
    optimizer, generated = generate_result(settings)
    data = generated.transmit.encode()
    decoded = DistroResult.decode(data, optimizer.layout)
    assert decoded == generated.transmit
    assert decoded.data_hash() == generated.transmit.data_hash()
    assert decoded.trainer_nonce == 2
    assert decoded.batch_id == BatchId(8, 11)
    assert len(data) == decoded.payload_bytes() + 30 + 1 + sum(
        1 + len(t.xshape) + 1 + 1 for t in decoded.tensors
    )


def test_commitment_is_reference_hash() -> None:
    _, generated = generate_result(ONE_BIT, step=7, start=40)
    result = generated.transmit
    digest = hashlib.sha256(struct.pack(">IQQ", 7, 40, 43))
    for tensor in result.tensors:
        digest.update(tensor.idx + tensor.val)
    assert result.data_hash() == digest.digest()
    other = dataclasses.replace(result, batch_id=BatchId(40, 44))
    assert other.data_hash() != result.data_hash()
    renonced = dataclasses.replace(result, trainer_nonce=99)
    assert renonced.data_hash() == result.data_hash()  # the nonce is not committed


def test_prototype_model_payload_is_3038_bytes() -> None:
    """224 tiles x 8 x 12 bits + 18 norm chunks x 8 x 6 bits of indices, 1,936 sign bits
    (the reference's u16/u8 indices made it 3,970)."""
    shapes = llama_shapes(hidden=128, intermediate=384, layers=4, heads=4, vocab=256)
    layout = ResultLayout.for_parameters(shapes, chunk=64, topk=8, kind=ValueKind.ONE_BIT)
    assert sum(t.idx_bytes() for t in layout.tensors) == 2688 + 108
    assert layout.payload_bytes() == 2796 + 242


def test_20m_model_blob_within_one_percent_of_formula() -> None:
    shapes = llama_shapes(hidden=256, intermediate=768, layers=4, heads=8, vocab=32000)
    layout = ResultLayout.for_parameters(shapes, chunk=64, topk=8, kind=ValueKind.ONE_BIT)
    tensors = tuple(
        TensorPayload(
            t.xshape,
            t.totalk,
            t.k,
            bytes(t.idx_bytes()),
            bytes(t.val_bytes(layout.value_kind)),
        )
        for t in layout.tensors
    )
    result = DistroResult(5, BatchId(0, 7), 0, layout.value_kind, tensors)
    size = len(result.encode())
    formula = layout.payload_bytes()
    assert 60_000 < formula < 65_000  # 12-bit indices: 600x fewer bytes than bf16
    assert 2 * sum(math.prod(t.shape) for t in layout.tensors) / size > 600
    assert formula <= size <= formula * 1.01


def _corrupt(data: bytes, offset: int, value: int) -> bytes:
    out = bytearray(data)
    out[offset] = value
    return bytes(out)


def test_rejects_truncated_and_trailing_bytes() -> None:
    optimizer, generated = generate_result()
    data = generated.transmit.encode()
    with pytest.raises(ResultDecodeError, match="truncated"):
        DistroResult.decode(data[:-1], optimizer.layout)
    with pytest.raises(ResultDecodeError, match="trailing"):
        DistroResult.decode(data + b"\0", optimizer.layout)
    with pytest.raises(ResultDecodeError, match="truncated"):
        DistroResult.decode(data[:10], optimizer.layout)


def test_rejects_bad_header() -> None:
    optimizer, generated = generate_result()
    data = generated.transmit.encode()
    with pytest.raises(ResultDecodeError, match="magic"):
        DistroResult.decode(b"XXXX" + data[4:], optimizer.layout)
    with pytest.raises(ResultDecodeError, match="version 9 is not supported"):
        DistroResult.decode(_corrupt(data, 4, 9), optimizer.layout)
    with pytest.raises(ResultDecodeError, match="value kind"):
        DistroResult.decode(_corrupt(data, 5, 1), optimizer.layout)
    with pytest.raises(ResultDecodeError, match="unknown value kind"):
        DistroResult.decode(_corrupt(data, 5, 7), optimizer.layout)
    with pytest.raises(ResultDecodeError, match="end < start"):
        DistroResult.decode(data[:14] + struct.pack(">QQ", 9, 3) + data[30:], optimizer.layout)


def test_rejects_mis_shaped_result() -> None:
    optimizer, generated = generate_result()
    data = generated.transmit.encode()
    other_chunk = ResultLayout.for_parameters(
        [(t.name, t.shape) for t in optimizer.layout.tensors],
        chunk=2,
        topk=3,
        kind=ValueKind.BF16,
    )
    with pytest.raises(ResultDecodeError, match="xshape"):
        DistroResult.decode(data, other_chunk)
    other_k = ResultLayout.for_parameters(
        [(t.name, t.shape) for t in optimizer.layout.tensors],
        chunk=4,
        topk=2,
        kind=ValueKind.BF16,
    )
    with pytest.raises(ResultDecodeError, match=" k "):
        DistroResult.decode(data, other_k)
    fewer = ResultLayout(optimizer.layout.tensors[:2], optimizer.layout.value_kind)
    with pytest.raises(ResultDecodeError, match="3 tensors"):
        DistroResult.decode(data, fewer)
    bigger = ResultLayout.for_parameters(
        [("b", (16,)), ("w_a", (10, 8)), ("w_z", (16, 24))],
        chunk=4,
        topk=3,
        kind=ValueKind.BF16,
    )
    with pytest.raises(ResultDecodeError, match="tensor 'b': xshape"):
        DistroResult.decode(data, bigger)


def test_refuses_a_version_1_result_with_u16_indices() -> None:
    """A result in the reference-width format (version 1: u8/u16 indices) is refused by
    version, not misread as bit-packed indices."""
    optimizer, generated = generate_result(ONE_BIT)
    result = generated.transmit
    parts = [
        struct.pack(">4sBBIIQQ", b"PSDR", 1, 1, result.step, 0, 8, 11),
        bytes([len(result.tensors)]),
    ]
    for tensor in result.tensors:
        wide = tensor.indices().astype("<u1" if tensor.totalk <= 256 else "<u2").tobytes()
        shape = bytes([len(tensor.xshape), *tensor.xshape, tensor.totalk, tensor.k])
        parts += [shape, wide, tensor.val]
    with pytest.raises(ResultDecodeError, match=r"version 1 is not supported.*version 2"):
        DistroResult.decode(b"".join(parts), optimizer.layout)


def _with_indices(result: DistroResult, position: int, idx: list[int]) -> DistroResult:
    tensor = result.tensors[position]
    packed = pack_indices(torch.tensor(idx), tensor.totalk)
    tensors = list(result.tensors)
    tensors[position] = dataclasses.replace(tensor, idx=packed)
    return dataclasses.replace(result, tensors=tuple(tensors))


def test_rejects_index_out_of_range_and_duplicates() -> None:
    params = [("v", torch.nn.Parameter(torch.randn(6)))]  # chunks of 3: 2-bit indices
    optimizer = DistroOptimizer(params, DistroSettings(0.9, 2, 3, False))
    params[0][1].grad = torch.randn(6)
    result = optimizer.generate(0.1, 1, BatchId(0, 0), 0).transmit
    assert DistroResult.decode(result.encode(), optimizer.layout) == result
    out_of_range = _with_indices(result, 0, [0, 1, 2, 3])
    with pytest.raises(ResultDecodeError, match="tensor 'v': index 3 out of range for 3"):
        DistroResult.decode(out_of_range.encode(), optimizer.layout)
    duplicate = _with_indices(result, 0, [0, 1, 2, 2])
    with pytest.raises(ResultDecodeError, match="tensor 'v': a chunk lists the same"):
        DistroResult.decode(duplicate.encode(), optimizer.layout)
    across_chunks = _with_indices(result, 0, [1, 2, 1, 2])  # same index in two chunks: fine
    assert DistroResult.decode(across_chunks.encode(), optimizer.layout) == across_chunks


def test_rejects_nonzero_index_padding() -> None:
    optimizer, generated = generate_result()  # tensor "b": 9 indices x 2 bits = 18 bits
    tensor = generated.transmit.tensors[0]
    assert len(tensor.idx) == 3
    bad = dataclasses.replace(tensor, idx=tensor.idx[:2] + bytes([tensor.idx[2] | 0x80]))
    result = dataclasses.replace(generated.transmit, tensors=(bad, *generated.transmit.tensors[1:]))
    with pytest.raises(ResultDecodeError, match="tensor 'b': padding bits after the last index"):
        DistroResult.decode(result.encode(), optimizer.layout)


def test_rejects_non_finite_values() -> None:
    optimizer, generated = generate_result()
    tensor = generated.transmit.tensors[0]
    nan = bytes([0xC0, 0x7F])  # bf16 NaN, little-endian
    bad = dataclasses.replace(tensor, val=nan + tensor.val[2:])
    result = dataclasses.replace(generated.transmit, tensors=(bad, *generated.transmit.tensors[1:]))
    with pytest.raises(ResultDecodeError, match="NaN"):
        DistroResult.decode(result.encode(), optimizer.layout)


def test_rejects_negative_two_bit_scale() -> None:
    optimizer, generated = generate_result(TWO_BIT)
    tensor = generated.transmit.tensors[0]
    bad = dataclasses.replace(
        tensor, val=tensor.val[:1] + bytes([tensor.val[1] | 0x80]) + tensor.val[2:]
    )
    result = dataclasses.replace(generated.transmit, tensors=(bad, *generated.transmit.tensors[1:]))
    with pytest.raises(
        ResultDecodeError, match="tensor 'b': 2-bit chunk scales must not be negative"
    ):
        DistroResult.decode(result.encode(), optimizer.layout)
    assert DistroResult.decode(generated.transmit.encode(), optimizer.layout) == generated.transmit


def test_rejects_nonzero_sign_padding() -> None:
    optimizer, generated = generate_result(ONE_BIT)
    tensor = generated.transmit.tensors[0]  # "b": 3 chunks x 3 = 9 bits -> 2 bytes
    bad = dataclasses.replace(tensor, val=tensor.val[:1] + bytes([tensor.val[1] | 0x80]))
    result = dataclasses.replace(generated.transmit, tensors=(bad, *generated.transmit.tensors[1:]))
    with pytest.raises(ResultDecodeError, match="padding"):
        DistroResult.decode(result.encode(), optimizer.layout)


def test_rejects_non_canonical_varint() -> None:
    optimizer, generated = generate_result()
    data = generated.transmit.encode()
    # tensor count 3 written as 0x83 0x00
    padded = data[:30] + bytes([0x83, 0x00]) + data[31:]
    with pytest.raises(ResultDecodeError, match="shortest"):
        DistroResult.decode(padded, optimizer.layout)


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(
        st.one_of(
            st.tuples(st.integers(1, 40)),
            st.tuples(st.integers(1, 30), st.integers(1, 30)),
        ),
        min_size=1,
        max_size=4,
    ),
    chunk=st.integers(1, 20),
    topk=st.integers(1, 50),
    bits=st.sampled_from([1, 2, 16]),
    seed=st.integers(0, 2**16),
)
def test_roundtrip_any_layout(
    shapes: list[tuple[int, ...]], chunk: int, topk: int, bits: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    params = [
        (f"p{i}", torch.nn.Parameter(torch.randn(shape, generator=gen)))
        for i, shape in enumerate(shapes)
    ]
    settings_ = DistroSettings(0.9, topk, chunk, bits == 1, quantize_2bit=bits == 2)
    optimizer = DistroOptimizer(params, settings_)
    for _, p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    result = optimizer.generate(0.1, 9, BatchId(3, 5), 1).transmit
    assert result.payload_bytes() == optimizer.layout.payload_bytes()
    assert DistroResult.decode(result.encode(), optimizer.layout) == result
