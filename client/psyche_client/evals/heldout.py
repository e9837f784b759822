"""The held-out loss: the model's mean next-token cross-entropy on sequences of the run data's
held-out split, which no client trains on.

The built-in corpus keeps its last 5 % as its validation split (`psyche_common.data.builtin`);
`heldout_sequences` takes `count` sequences of `seq_len` tokens spread evenly over it, the
same ones at every step and on every client, so the figure moves only with the weights. Other
data locations have no held-out split here (`NoHeldOutSplit`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import torch
from psyche_common.config import AnyDataLocation, BuiltinData
from psyche_common.data.builtin import python_stdlib_splits

from psyche_client.evals.access import Run


class NoHeldOutSplit(ValueError):
    """The run's data location has no held-out split."""


def heldout_sequences(
    location: AnyDataLocation, seq_len: int, count: int, cache_dir: str | None = None
) -> np.ndarray:
    """`count` × `seq_len` int64 tokens spread evenly over the held-out split of `location`."""
    if not isinstance(location, BuiltinData):
        raise NoHeldOutSplit(
            f"the run's data location ({type(location).__name__}) has no held-out split: only "
            "the built-in corpus has one"
        )
    _, validation = python_stdlib_splits(cache_dir)
    tokens = np.asarray(validation, dtype=np.int64)
    if len(tokens) < seq_len:
        raise NoHeldOutSplit(f"the held-out split has {len(tokens)} tokens, under {seq_len}")
    starts = np.linspace(0, len(tokens) - seq_len, num=count).astype(np.int64)
    return np.stack([tokens[s : s + seq_len] for s in starts])


def token_losses(model: torch.nn.Module, tokens: np.ndarray) -> tuple[float, int]:
    """(sum of next-token cross-entropies, number of predicted tokens) over `tokens`."""
    device = next(model.parameters()).device
    batch = torch.from_numpy(np.ascontiguousarray(tokens)).to(device)
    logits = model(input_ids=batch).logits.float()
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
    )
    return float(loss), int(batch[:, 1:].numel())


def heldout_loss(run: Run[Any], sequences: np.ndarray, batch_size: int) -> float:
    """The mean next-token loss over `sequences`, `batch_size` sequences per piece of work."""
    total, count = 0.0, 0
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        piece_total, piece_count = run(partial(token_losses, tokens=chunk))
        total += piece_total
        count += piece_count
    return total / count
