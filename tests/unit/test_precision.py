"""`--dtype` and its siblings: the `Precision` the flags give, `auto` per device, and what the
multi-device client refuses."""

from __future__ import annotations

import pytest
from psyche_client.app.options import ClientOptions
from psyche_client.training.model.precision import Precision, resolve_dtype_name
from psyche_client.training.parallel.plan import ParallelSpec, ranks_precision
from psyche_common.protocol import Identity


def test_auto_is_bf16_on_cuda_and_fp32_elsewhere() -> None:
    assert Precision().resolved("cuda") == "bf16"
    assert Precision().resolved("cpu") == "fp32"
    assert Precision().resolved("mps") == "fp32"
    assert Precision(dtype="bf16").resolved("cpu") == "bf16"
    assert resolve_dtype_name("fp32", "cuda") == "fp32"
    with pytest.raises(ValueError, match="dtype must be one of"):
        Precision(dtype="fp16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attn_implementation"):
        Precision(attn_implementation="xformers")  # type: ignore[arg-type]


def test_flags_reach_the_backend_options() -> None:
    values: dict[str, object] = {
        "server_addr": "h:1",
        "run_id": "r",
        "dtype": "bf16",
        "grad_accum_in_fp32": True,
        "activation_checkpointing": True,
        "attn_implementation": "eager",
    }
    options = ClientOptions.from_flags(values, Identity.generate())
    assert options.backend.precision == Precision("bf16", True, True, "eager")
    defaults = ClientOptions.from_flags({"server_addr": "h:1", "run_id": "r"}, Identity.generate())
    assert defaults.backend.precision == Precision("auto", False, False, "sdpa")


def test_ranks_resolve_auto_and_fsdp_refuses_what_it_cannot_do() -> None:
    replicated = ParallelSpec(2)
    sharded = ParallelSpec(2, fsdp=True)
    assert ranks_precision(Precision(), replicated, "cuda").dtype == "bf16"
    assert ranks_precision(Precision(), sharded, "cpu").dtype == "fp32"
    everything = Precision("bf16", True, True, "flash_attention_2")
    assert ranks_precision(everything, replicated, "cuda") == everything
    with pytest.raises(ValueError, match="--grad-accum-in-fp32 is not supported with --fsdp"):
        ranks_precision(Precision(grad_accum_in_fp32=True), sharded, "cuda")
    with pytest.raises(ValueError, match="flash_attention_2 is not supported with --fsdp"):
        ranks_precision(Precision(attn_implementation="flash_attention_2"), sharded, "cuda")
    assert ranks_precision(Precision(activation_checkpointing=True), sharded, "cpu").dtype == "fp32"
