"""How the kept coefficients' values travel: one codec per value format, registered by kind.

Each format is one module holding its `ValueCodec` (`size`, `quantize`, `dequantize`; the
interface and shared byte checks are `codec`) and one line in the registry, `kinds.ValueKind`,
whose member value is the result header's value-kind byte:

| kind | byte | module | values |
|---|---|---|---|
| `BF16` | 0 | `bf16` | every value as bf16 |
| `ONE_BIT` | 1 | `one_bit` | the sign only (the reference's `quantize_1bit`) |
| `TWO_BIT` | 2 | `two_bit` | a bf16 scale per chunk, 2-bit codes on `{s/3, s}` |
| `TWO_BIT_CODEBOOK` | 3 | `codebook` | bf16 mean and deviation per chunk, 2-bit codes |
| `FOUR_BIT` | 4 | `four_bit` | a bf16 scale per chunk, a sign and 3 magnitude bits |

Each module's docstring gives its byte layout. `quantize(val, kind)`, `dequantize(data,
kind, chunks, k)` and `value_bytes(kind, chunks, k)` call the kind's codec;
`value_kind_named(name)` finds a kind by its codec's name (`value_format` in `state.toml`).
"""

from __future__ import annotations

import numpy as np
import torch

from psyche_client.distro.values.codec import ValueCodec
from psyche_client.distro.values.kinds import ValueKind, value_kind_named

__all__ = ["ValueCodec", "ValueKind", "dequantize", "quantize", "value_bytes", "value_kind_named"]


def value_bytes(kind: ValueKind, chunks: int, k: int) -> int:
    """Bytes taken by the values of `chunks` chunks of `k` kept coefficients."""
    return kind.codec.size(chunks, k)


def quantize(val: torch.Tensor, kind: ValueKind) -> tuple[bytes, torch.Tensor]:
    """`(packed bytes, dequantized values)` of `val` (`[chunks, k]`, any float dtype), the
    values in `val`'s dtype and device (for `ONE_BIT` the +-1 a receiver reads)."""
    return kind.codec.quantize(val)


def dequantize(data: bytes, kind: ValueKind, chunks: int, k: int) -> np.ndarray:
    """The values a receiver reads from `data`: float64 `[chunks, k]`."""
    return kind.codec.dequantize(data, chunks, k)
