"""The names of the model presets the client ships (`checkpoint.repo_id = "builtin:NAME"`).

The preset configs live with the client (`psyche_client/training/model/presets/NAME.json`,
which needs torch to build); the server's `validate-config` only needs their names, so they
are listed here too, and a client test checks that the two lists agree.
"""

from __future__ import annotations

BUILTIN_MODEL_PREFIX = "builtin:"
BUILTIN_MODELS = ("llama-20m", "llama-2m", "llama-tiny")
