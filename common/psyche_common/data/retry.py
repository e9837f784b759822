"""Retrying data reads with the reference's linear backoff (0, 2, 4, … 12 s over 7 attempts).

``RetryPolicy`` (``psyche_common.retry``, re-exported here) holds the schedule (configurable so
tests run fast); ``retry_async`` runs one operation under it with the project's retry builders,
and ``get_samples_with_retries`` wraps a whole provider call the way the reference client's data
fetcher does. Only transient failures are retried: network errors,
timeouts and ``DataFetchError(retryable=True)``; a missing sample or a bad file fails at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from tenacity import RetryCallState

from psyche_common.batch_id import BatchId
from psyche_common.data.errors import DataFetchError
from psyche_common.retry import RetryPolicy, call, failure, linear, retry_on, retrying

if TYPE_CHECKING:
    import numpy as np

    from psyche_common.data.provider import DataProvider

T = TypeVar("T")

__all__ = ["RetryPolicy", "get_samples_with_retries", "is_transient", "retry_async"]
logger = logging.getLogger(__name__)


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

    def log_failure(state: RetryCallState) -> None:
        logger.warning(
            "%s failed (attempt %d of %d): %s",
            what,
            state.attempt_number,
            policy.attempts,
            failure(state),
            extra={"attempt": state.attempt_number, "attempts": policy.attempts},
        )

    def give_up(state: RetryCallState) -> T:
        last_error = failure(state)
        raise DataFetchError(
            f"{what} failed after {policy.attempts} attempts: {last_error}", retryable=False
        ) from last_error

    policy_retrying = retrying(
        wait=linear(policy.delay_step),
        retry=retry_on(is_transient),
        attempts=policy.attempts,
        after=log_failure,
        on_give_up=give_up,
    )
    return await call(policy_retrying, operation)


async def get_samples_with_retries(
    provider: DataProvider, batch: BatchId, policy: RetryPolicy | None = None
) -> np.ndarray:
    """``provider.get_samples(batch)`` retried on transient failures (the client's fetch loop)."""
    return await retry_async(
        lambda: provider.get_samples(batch), policy or RetryPolicy(), f"fetching samples {batch}"
    )
