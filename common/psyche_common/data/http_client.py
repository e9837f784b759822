"""Small HTTP reads for the data providers: HEAD sizing, ranged GETs and whole-document GETs.

``HttpSession`` runs each request as a stdlib ``urllib`` call on its own thread pool, bounded by ``HttpOptions.timeout``
(the reference uses 5 s) and retried on transient failures (connection errors, timeouts, 408,
429 and 5xx) with ``HttpOptions.retry``. Answers that will not change (404, 403, a server that
ignores ``Range``) fail at once with a ``DataFetchError`` naming the URL.
"""

from __future__ import annotations

import asyncio
import http.client
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from psyche_common.data.errors import DataFetchError
from psyche_common.data.retry import RetryPolicy, retry_async

GCS_JSON_API = "https://storage.googleapis.com/storage/v1"
_RETRYABLE_STATUS = {408, 425, 429}
_USER_AGENT = "psyche-py-data/0.1"
T = TypeVar("T")


@dataclass(frozen=True)
class HttpOptions:
    """Network settings shared by the HTTP-based providers."""

    timeout: float = 5.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_concurrent_requests: int = 8
    head_concurrency: int = 3
    gcs_api_base: str = GCS_JSON_API


def _check_url(url: str) -> None:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise DataFetchError(
            f"unsupported URL {url!r}: expected http:// or https://", retryable=False
        )


def _http_error(method: str, url: str, error: urllib.error.HTTPError) -> DataFetchError:
    retryable = error.code in _RETRYABLE_STATUS or error.code >= 500
    return DataFetchError(
        f"HTTP {error.code} {error.reason} for {method} {url}", retryable=retryable
    )


def _open(request: urllib.request.Request, timeout: float) -> http.client.HTTPResponse:
    method, url = request.get_method(), request.full_url
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise _http_error(method, url, exc) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise DataFetchError(f"{method} {url} timed out after {timeout} s") from None
        raise DataFetchError(f"cannot reach {url}: {exc.reason}") from None
    except TimeoutError:
        raise DataFetchError(f"{method} {url} timed out after {timeout} s") from None
    except OSError as exc:
        raise DataFetchError(f"{method} {url} failed: {exc}") from None


def _read_exact(
    response: http.client.HTTPResponse, length: int, method: str, url: str, timeout: float
) -> bytes:
    try:
        body = response.read(length)
    except TimeoutError:
        raise DataFetchError(f"{method} {url} timed out after {timeout} s") from None
    except OSError as exc:
        raise DataFetchError(f"{method} {url} failed while reading: {exc}") from None
    if len(body) != length:
        raise DataFetchError(
            f"Received unexpected number of bytes from {url}: {len(body)} instead of {length}"
        )
    return body


def _blocking_head(url: str, timeout: float) -> int:
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": _USER_AGENT})
    with _open(request, timeout) as response:
        length = response.headers.get("Content-Length")
    if length is None or not length.strip().isdigit():
        raise DataFetchError(
            f"URL validation failed: HEAD {url} gave no Content-Length", retryable=False
        )
    return int(length)


def _blocking_range(url: str, start: int, length: int, timeout: float) -> bytes:
    headers = {"User-Agent": _USER_AGENT, "Range": f"bytes={start}-{start + length - 1}"}
    request = urllib.request.Request(url, headers=headers)
    with _open(request, timeout) as response:
        if response.status == 200:
            total = response.headers.get("Content-Length")
            if start != 0 or total is None or int(total) != length:
                raise DataFetchError(
                    f"{url} ignored the Range header (status 200 instead of 206); ranged reads "
                    "need a server that supports them",
                    retryable=False,
                )
        elif response.status != 206:
            raise DataFetchError(f"unexpected HTTP status {response.status} for GET {url}")
        return _read_exact(response, length, "GET", url, timeout)


def _blocking_get(url: str, timeout: float, max_bytes: int) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    with _open(request, timeout) as response:
        try:
            body = response.read(max_bytes + 1)
        except (TimeoutError, OSError) as exc:
            raise DataFetchError(f"GET {url} failed while reading: {exc}") from None
    if len(body) > max_bytes:
        raise DataFetchError(f"{url} is larger than {max_bytes} bytes", retryable=False)
    return body


class HttpSession:
    """Runs blocking urllib requests on its own thread pool, so queued requests never wait for
    threads the rest of the process uses, and a request's timeout covers only its own work."""

    def __init__(self, options: HttpOptions | None = None) -> None:
        self.options = options or HttpOptions()
        workers = self.options.max_concurrent_requests + self.options.head_concurrency
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="psyche-http")
        self._requests = asyncio.Semaphore(self.options.max_concurrent_requests)

    async def _run(self, what: str, func: Callable[..., T], *args: object) -> T:
        timeout = self.options.timeout

        async def attempt() -> T:
            async with self._requests:
                loop = asyncio.get_running_loop()
                future = loop.run_in_executor(self._executor, func, *args)
                try:
                    return await asyncio.wait_for(future, timeout)
                except TimeoutError:
                    raise DataFetchError(f"{what} timed out after {timeout} s") from None

        return await retry_async(attempt, self.options.retry, what)

    async def head_content_length(self, url: str) -> int:
        """Size of the resource at ``url`` from a HEAD request's Content-Length."""
        _check_url(url)
        return await self._run(f"HEAD {url}", _blocking_head, url, self.options.timeout)

    async def get_range(self, url: str, start: int, length: int) -> bytes:
        """Exactly ``length`` bytes of ``url`` from byte ``start`` (a ranged GET)."""
        _check_url(url)
        if length <= 0:
            return b""
        what = f"GET {url} bytes {start}-{start + length - 1}"
        return await self._run(what, _blocking_range, url, start, length, self.options.timeout)

    async def get_document(self, url: str, max_bytes: int = 64 << 20) -> bytes:
        """The whole body at ``url`` (configs, bucket listings), at most ``max_bytes``."""
        _check_url(url)
        return await self._run(f"GET {url}", _blocking_get, url, self.options.timeout, max_bytes)

    def close(self) -> None:
        """Stop the worker threads (requests still running finish in the background)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
