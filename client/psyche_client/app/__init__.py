"""The client process: its options (`options`, from the flag table `flags`), the parts it is
composed of (`parts`), the wiring (`app.ClientApp`) and the dashboard's view of it
(`snapshot`). Only the CLI and the dashboard import this package.

The names below load on first use, so the CLI reads its flag table (`flags`) and refuses bad
input without importing torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psyche_client.app.app import ClientApp, run_client
    from psyche_client.app.options import ClientOptions, ServerOptions
    from psyche_client.app.parts import Parts

__all__ = ["ClientApp", "ClientOptions", "Parts", "ServerOptions", "run_client"]

_HOMES = {
    "ClientApp": "app",
    "run_client": "app",
    "ClientOptions": "options",
    "ServerOptions": "options",
    "Parts": "parts",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
