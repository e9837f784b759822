"""The exact encoded size of a result, from the run's layout alone.

Every result of a run has the same length: the fixed header, the tensor count, and per
tensor its framing varints (`ndim`, the encoded shape, `totalk`, `k`) followed by the
bit-packed indices and the values, whose lengths the layout fixes (docs/distro.md, "The
result format (version 2)"). A peer that announces any other size announces bytes that
cannot decode, so the announcement is refused before a byte of the result is fetched.

API: `encoded_result_size(layout) -> int`, `HEADER_BYTES`.
"""

from __future__ import annotations

from psyche_client.distro.result import ResultLayout
from psyche_client.distro.wire import varint

HEADER_BYTES = 30
"""magic 4, version 1, value kind 1, step 4, trainer nonce 4, batch start 8, batch end 8."""


def encoded_result_size(layout: ResultLayout) -> int:
    """Bytes of `DistroResult.encode()` for any result with this layout."""
    size = HEADER_BYTES + len(varint(len(layout.tensors)))
    for tensor in layout.tensors:
        size += len(varint(len(tensor.xshape)))
        size += sum(len(varint(d)) for d in tensor.xshape)
        size += len(varint(tensor.totalk)) + len(varint(tensor.k))
        size += tensor.idx_bytes() + tensor.val_bytes(layout.value_kind)
    return size
