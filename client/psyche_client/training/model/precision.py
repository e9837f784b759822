"""How a client trains numerically: the parameter dtype, fp32 gradient accumulation,
activation checkpointing and the attention kernel (`psyche-client train --dtype ...`).

`Precision` is the plain, torch-free setting the flags fill (`weights.backends.BackendOptions`
holds one) and the trainer, the model loader and the multi-device engines read. What stays in
fp32 whatever `dtype` says (docs/client.md, "Precision and memory"):

* DisTrO's momentum / SparseLoCo's error-feedback buffer (`state_dtype`): it sums small
  per-step contributions over many steps and feeds error feedback, which bf16 would round away;
* the aggregate of the applied results (an exact float64 scatter, a float64 inverse DCT), so
  only the final `sign` (or the bf16-rounded SparseLoCo update) reaches the weights;
* the loss (transformers upcasts the logits), the gradient norm and, with
  `grad_accum_in_fp32`, the sum of the micro-batch gradients.

The parameters, their gradients and the lookahead's saved copy are in `dtype`; the weights
hash covers the parameters' stored bytes, so two clients agree exactly when their bf16 (or
fp32) bytes do.

`resolve_dtype_name(precision.dtype, device_type)` turns `auto` into bf16 on CUDA and fp32
elsewhere (CPU bf16 matmuls are slower than fp32 on most CPUs; MPS lacks some bf16 kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DtypeName = Literal["auto", "bf16", "fp32"]
AttnImplementation = Literal["eager", "sdpa", "flash_attention_2"]

DTYPE_NAMES: tuple[DtypeName, ...] = ("auto", "bf16", "fp32")
ATTN_IMPLEMENTATIONS: tuple[AttnImplementation, ...] = ("eager", "sdpa", "flash_attention_2")
STATE_DTYPE = "fp32"
"""The dtype of DisTrO's momentum and SparseLoCo's error feedback, whatever `dtype` is."""


@dataclass(frozen=True)
class Precision:
    """The numeric settings of training (see the module docstring)."""

    dtype: DtypeName = "auto"
    grad_accum_in_fp32: bool = False
    activation_checkpointing: bool = False
    attn_implementation: AttnImplementation = "sdpa"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                "attn_implementation must be one of "
                f"{', '.join(ATTN_IMPLEMENTATIONS)}, got {self.attn_implementation!r}"
            )

    def resolved(self, device_type: str) -> Literal["bf16", "fp32"]:
        """The parameter dtype on a device of `device_type` ("cuda", "cpu", "mps")."""
        return resolve_dtype_name(self.dtype, device_type)


def resolve_dtype_name(dtype: DtypeName | str, device_type: str) -> Literal["bf16", "fp32"]:
    """`auto` → bf16 on CUDA, fp32 elsewhere; `bf16` / `fp32` as given."""
    if dtype == "auto":
        return "bf16" if device_type == "cuda" else "fp32"
    if dtype == "bf16":
        return "bf16"
    if dtype == "fp32":
        return "fp32"
    raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
