"""Device choice for the client: turns the `--device` flag into a `torch.device`.

`auto` picks CUDA when a GPU is visible, then Apple MPS, else the CPU. Explicit `cuda` /
`cuda:N` / `mps` requests fail with a clear message when that device is missing, instead of
failing later inside torch.
"""

from __future__ import annotations

import torch


class DeviceError(ValueError):
    """The requested device string is malformed or the device is not available."""


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_device(spec: str = "auto") -> torch.device:
    """Resolve `auto`, `cpu`, `mps`, `cuda` or `cuda:N` to an available `torch.device`."""
    text = spec.strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", 0)
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "mps":
        if not _mps_available():
            raise DeviceError(
                "--device mps was requested but MPS is not available on this machine: "
                "use --device cpu (or auto)"
            )
        return torch.device("mps")
    if text == "cuda" or text.startswith("cuda:"):
        index_text = text.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise DeviceError(f"invalid --device {spec!r}: expected cuda:N with N a GPU number")
        index = int(index_text)
        if not torch.cuda.is_available():
            raise DeviceError(
                f"--device {spec} was requested but CUDA is not available (no GPU is visible, "
                "or this torch is a CPU build): use --device cpu (or auto)"
            )
        count = torch.cuda.device_count()
        if index >= count:
            raise DeviceError(f"--device {spec} was requested but only {count} GPU(s) are visible")
        return torch.device("cuda", index)
    raise DeviceError(f"invalid --device {spec!r}: expected auto, cpu, mps, cuda or cuda:N")
