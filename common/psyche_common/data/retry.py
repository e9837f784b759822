"""Retrying data reads with the reference's linear backoff (0, 2, 4, … 12 s over 7 attempts).

``RetryPolicy`` holds the schedule (configurable so tests run fast); ``retry_async`` runs one
operation under it, and ``get_samples_with_retries`` wraps a whole provider call the way the
reference client's data fetcher does. Only transient failures are retried: network errors,
timeouts and ``DataFetchError(retryable=True)``; a missing sample or a bad file fails at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from psyche_common.batch_id import BatchId
from psyche_common.data.errors import DataFetchError

if TYPE_CHECKING:
    import numpy as np

    from psyche_common.data.provider import DataProvider

T = TypeVar("T")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries; the wait before attempt k (1-based) is ``delay_step * (k - 1)`` s."""

    attempts: int = 7
    delay_step: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.delay_step < 0:
            raise ValueError(f"RetryPolicy.delay_step must be >= 0, got {self.delay_step}")

    def delay_before(self, attempt: int) -> float:
        return self.delay_step * (attempt - 1)


def is_transient(error: BaseException) -> bool:
    """True for failures that another attempt may cure."""
    if isinstance(error, DataFetchError):
        return error.retryable
    return isinstance(error, OSError | EOFError | TimeoutError | ConnectionError)


async def retry_async(operation: Callable[[], Awaitable[T]], policy: RetryPolicy, what: str) -> T:
    """Run ``operation`` until it succeeds, a permanent error occurs, or attempts run out.

    After the last attempt fails it raises ``DataFetchError(retryable=False)`` naming ``what``,
    so an outer retry loop does not multiply the attempts.
    """
    last_error: BaseException | None = None
    for attempt in range(1, policy.attempts + 1):
        delay = policy.delay_before(attempt)
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            return await operation()
        except Exception as exc:
            if not is_transient(exc):
                raise
            last_error = exc
            logger.warning(
                "%s failed (attempt %d of %d): %s",
                what,
                attempt,
                policy.attempts,
                exc,
                extra={"attempt": attempt, "attempts": policy.attempts},
            )
    raise DataFetchError(
        f"{what} failed after {policy.attempts} attempts: {last_error}", retryable=False
    ) from last_error


async def get_samples_with_retries(
    provider: DataProvider, batch: BatchId, policy: RetryPolicy | None = None
) -> np.ndarray:
    """``provider.get_samples(batch)`` retried on transient failures (the client's fetch loop)."""
    return await retry_async(
        lambda: provider.get_samples(batch), policy or RetryPolicy(), f"fetching samples {batch}"
    )
