"""`ModelLM`: the client's live model as an lm-evaluation-harness `LM`.

lm-eval asks a model for the log-likelihood of continuations given contexts (every
multiple-choice task: ARC, BoolQ, HellaSwag, MMLU, OpenBookQA, PIQA). `ModelLM` tokenizes each
request (the context's tokens, then the rest of context + continuation), keeps the last
`max_length + 1` tokens, and scores the requests `batch_size` at a time, each batch one piece
of work lent the live model by `ModelAccess` (so training takes the model back between
batches). Sequences of a batch are right-padded: a causal model's logits at a position never
depend on later positions, so padding changes no score. The requests are scored in the order
lm-eval gives them, so equal weights give equal scores.

Generation tasks (`generate_until`) and rolling log-likelihoods (perplexity tasks) are not
supported: they raise `UnsupportedRequest` naming the request type.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from lm_eval.api.model import LM

from psyche_client.evals.access import Run
from psyche_client.evals.tokenizer import Tokenizer


class UnsupportedRequest(NotImplementedError):
    """A task asked for a request type the client's evals do not compute."""


def continuation_logprobs(
    model: torch.nn.Module, rows: Sequence[tuple[list[int], list[int]]]
) -> list[tuple[float, bool]]:
    """(sum of log p(continuation | context), whether every continuation token is the argmax)
    for each (context tokens, continuation tokens) row; a row's context + continuation must
    have at least 2 tokens and its continuation at least 1."""
    device = next(model.parameters()).device
    inputs = [(context + continuation)[:-1] for context, continuation in rows]
    width = max(len(tokens) for tokens in inputs)
    batch = torch.zeros((len(rows), width), dtype=torch.long)
    for i, tokens in enumerate(inputs):
        batch[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    logits = model(input_ids=batch.to(device)).logits.float()
    logprobs = torch.log_softmax(logits, dim=-1).cpu()
    scores: list[tuple[float, bool]] = []
    for i, ((_, continuation), tokens) in enumerate(zip(rows, inputs, strict=True)):
        end = len(tokens)
        start = end - len(continuation)
        row = logprobs[i, start:end]
        target = torch.tensor(continuation, dtype=torch.long)
        total = float(row.gather(1, target.unsqueeze(1)).sum())
        greedy = bool((row.argmax(dim=-1) == target).all())
        scores.append((total, greedy))
    return scores


class ModelLM(LM):  # lm-eval ships no type information: LM is Any here
    """The live model as an lm-eval `LM` (see the module docstring)."""

    def __init__(
        self, run: Run[Any], tokenizer: Tokenizer, max_length: int, batch_size: int
    ) -> None:
        super().__init__()
        if max_length < 2:
            raise ValueError(f"an eval needs a context of at least 2 tokens, got {max_length}")
        self.run = run
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context tokens, continuation tokens), the continuation tokenized with its
        context (so a word keeps the tokens it has in running text), cut to `max_length + 1`
        tokens from the left."""
        spaces = len(context) - len(context.rstrip())
        if spaces:  # lm-eval's convention: trailing spaces of the context start the answer
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tokenizer.encode(context + continuation)
        context_tokens = self.tokenizer.encode(context)
        continuation_tokens = whole[len(context_tokens) :]
        if not continuation_tokens:
            raise ValueError(f"the continuation {continuation!r} encodes to no tokens")
        if not context_tokens:  # nothing to condition the first token on: it is not scored
            context_tokens, continuation_tokens = continuation_tokens[:1], continuation_tokens[1:]
            if not continuation_tokens:
                raise ValueError(f"{continuation!r} without a context is a single token")
        continuation_tokens = continuation_tokens[-self.max_length :]
        keep = self.max_length + 1
        joined = (context_tokens + continuation_tokens)[-keep:]
        cut = max(0, len(joined) - len(continuation_tokens))
        return joined[:cut], joined[cut:]

    def loglikelihood(self, requests: Sequence[Any]) -> list[tuple[float, bool]]:
        rows = [self.encode_pair(*request.args) for request in requests]
        scores: list[tuple[float, bool]] = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            scores.extend(self.run(partial(continuation_logprobs, rows=chunk)))
        return scores

    def loglikelihood_rolling(self, requests: Sequence[Any]) -> list[float]:
        raise UnsupportedRequest(
            "rolling log-likelihoods (perplexity tasks) are not supported by the client's evals"
        )

    def generate_until(self, requests: Sequence[Any]) -> list[str]:
        raise UnsupportedRequest(
            "generation tasks (generate_until) are not supported by the client's evals: use "
            "multiple-choice tasks"
        )
