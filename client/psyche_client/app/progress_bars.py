"""Third-party progress bars off where they would garble the client's output.

The Hugging Face Hub's downloads and uploads, and transformers' loading of checkpoint shards,
draw tqdm bars on stderr: between `--logs json` lines they break every reader of the stream,
and over the dashboard they smear it. Unless the logs are plain console text, they are turned
off through huggingface_hub's own switch (which transformers reads when it is first imported;
an already imported transformers is switched off too). The client's own progress lines
(`psyche_common.progress`) say how a download or an upload goes instead.
"""

from __future__ import annotations

import sys


def silence_progress_bars(logs: str) -> bool:
    """Turn the Hub's (and transformers') progress bars off unless `logs` is `console`;
    whether they were turned off."""
    if logs == "console":
        return False
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    transformers_logging = sys.modules.get("transformers.utils.logging")
    if transformers_logging is not None:
        transformers_logging.disable_progress_bar()
    return True
