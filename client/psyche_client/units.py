"""Human-readable byte sizes for what the client shows people (the dashboard, `check`)."""

from __future__ import annotations


def format_bytes(value: float) -> str:
    """`512 B`, `1.5 KiB`, `3.0 MiB`, `2.0 GiB` (anything larger stays in GiB)."""
    for suffix in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if suffix == "B" else f"{value:.1f} {suffix}"
        value /= 1024
    return f"{value:.1f} GiB"
