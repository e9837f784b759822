"""Whether this machine can run the GPU suite, and the skip marks that say why not."""

from __future__ import annotations

import pytest
import torch


def missing_gpus(needed: int = 1) -> str | None:
    """Why a test needing `needed` CUDA devices cannot run here (None when it can)."""
    if not torch.cuda.is_available():
        return "needs a CUDA device: torch.cuda.is_available() is False on this machine"
    count = torch.cuda.device_count()
    if count < needed:
        return f"needs {needed} CUDA devices, {count} visible"
    return None


def needs_gpus(needed: int = 1) -> pytest.MarkDecorator:
    """Skip (with the reason) unless `needed` CUDA devices are visible."""
    reason = missing_gpus(needed)
    return pytest.mark.skipif(reason is not None, reason=reason or "")
