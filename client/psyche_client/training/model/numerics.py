"""Putting a loaded model into the numeric setup a `Precision` asks for: its torch dtype, the
attention kernel, activation checkpointing, and TF32 matmuls on CUDA.

`torch_dtype(name)` maps "bf16" / "fp32" to torch dtypes; `configure_model(model, precision,
device)` is called once after loading (the parameters already have their dtype: the loader
builds them in it) and raises `ValueError` naming the flag when the model or the machine
cannot do what was asked (flash_attention_2 without CUDA or the `flash_attn` package, a model
without gradient checkpointing).
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from psyche_client.training.model.precision import Precision

logger = logging.getLogger(__name__)

_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of "bf16" or "fp32" (see `Precision.resolved` for "auto")."""
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use bf16 or fp32") from None


def model_dtype(precision: Precision, device: torch.device) -> torch.dtype:
    """The parameter dtype `precision` gives on `device`."""
    return torch_dtype(precision.resolved(device.type))


def enable_tf32(device: torch.device) -> bool:
    """Let fp32 matmuls and convolutions use TF32 on CUDA (once, at load); False elsewhere."""
    if device.type != "cuda":
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


def check_attention(precision: Precision, device: torch.device) -> None:
    """Raise `ValueError` when this machine cannot run the requested attention kernel."""
    if precision.attn_implementation != "flash_attention_2":
        return
    if device.type != "cuda":
        raise ValueError(
            "--attn-implementation flash_attention_2 needs a CUDA device "
            f"(training on {device}); use sdpa"
        )
    if importlib.util.find_spec("flash_attn") is None:
        raise ValueError(
            "--attn-implementation flash_attention_2 needs the flash-attn package "
            "(pip install flash-attn); use sdpa"
        )


def configure_model(
    model: torch.nn.Module, precision: Precision, device: torch.device
) -> torch.nn.Module:
    """Set the attention kernel and activation checkpointing of a loaded Hugging Face model,
    and TF32 on CUDA; returns the model."""
    check_attention(precision, device)
    set_attn = getattr(model, "set_attn_implementation", None)
    if set_attn is not None:
        try:
            set_attn(precision.attn_implementation)
        except (ValueError, ImportError) as exc:
            if precision.attn_implementation != "sdpa":
                raise ValueError(
                    f"--attn-implementation {precision.attn_implementation}: {exc}"
                ) from exc
            # the default: a family without an sdpa kernel (Gemma2) keeps its own
            current = getattr(getattr(model, "config", None), "_attn_implementation", None)
            logger.warning(
                "%s has no sdpa attention; training with its %s kernel",
                type(model).__name__,
                current,
            )
    if precision.activation_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(
                f"--activation-checkpointing: {type(model).__name__} does not support "
                "gradient checkpointing"
            )
        # non-reentrant: recomputes the forward in backward with the same (lookahead) weights;
        # transformers 5 renamed the method (the old name warns)
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(  # type: ignore[operator]
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    enable_tf32(device)
    return model
