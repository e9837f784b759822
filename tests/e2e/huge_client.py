"""A test-only trainer that sends finite but enormous values (bf16 runs).

It is `psyche-client` with one change, its training backend (`Parts(backends=...)`): every
result it trains is sent with its values multiplied by `SCALE` (1e30), clipped to the largest
finite bf16 magnitude so the bytes stay valid (a NaN or infinity would be a decode error that
every client refuses alike). Its momentum, signatures, announcements and witnessing are
honest. Only results with bf16 values (`quantize_1bit = false`) are changed; the client exits
otherwise.
Run it with `psyche-client`'s arguments: `python tests/e2e/huge_client.py train ...`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.distro.compress import pack_bf16
from psyche_client.distro.result import DistroResult
from psyche_client.distro.values import ValueKind
from psyche_client.weights.backends import with_distro_backend

from tests.e2e.rewriting_backend import RewritingBackend

SCALE = 1e30
BF16_MAX = 3.3e38  # just under bf16's largest finite value (3.39e38)


def enormous(result: DistroResult) -> DistroResult:
    """`result` with every value times SCALE, clipped to finite bf16."""
    if result.value_kind != ValueKind.BF16:
        raise SystemExit("huge_client needs a bf16 run (quantize_1bit = false)")
    tensors = []
    for payload in result.tensors:
        values = np.clip(payload.values(ValueKind.BF16) * SCALE, -BF16_MAX, BF16_MAX)
        tensors.append(dataclasses.replace(payload, val=pack_bf16(torch.from_numpy(values))))
    return DistroResult(
        result.step, result.batch_id, result.trainer_nonce, result.value_kind, tuple(tensors)
    )


class HugeValuesBackend(RewritingBackend):
    """The DisTrO backend, sending every result it trains with enormous values (its momentum
    and error feedback keep the honest result)."""

    def rewrite(self, mine: DistroResult, cancelled: Callable[[], bool]) -> DistroResult:
        return enormous(mine)


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(backends=with_distro_backend(HugeValuesBackend)))


if __name__ == "__main__":
    main()
