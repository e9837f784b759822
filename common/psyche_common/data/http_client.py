"""HTTP reads for the data providers: HEAD sizing, ranged GETs and bounded document GETs.

One ``HttpSession`` owns one pooled ``httpx.AsyncClient``: HTTP/1.1 with keep-alive, at most
``max_concurrent_requests`` requests and connections at once, idle connections kept for
``keepalive_expiry`` seconds, redirects followed. Every request is bounded three ways:
``connect_timeout`` (opening a connection), ``read_timeout`` (the longest wait for the next
bytes) and ``request_timeout`` (the whole request, body included, so a trickling server cannot
hold a read forever). Transient failures (connection errors, timeouts, 408/425/429 and 5xx)
are retried with ``HttpOptions.retry``; answers that will not change (other 4xx, a server that
ignores ``Range`` for a partial read, a ``Content-Range`` other than the one asked for, a
document over its size limit) fail at once. Every failure is a ``DataFetchError`` naming the
method and URL. ``aclose()`` closes the pool.
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from psyche_common.data.errors import DataFetchError
from psyche_common.data.retry import RetryPolicy, retry_async

GCS_JSON_API = "https://storage.googleapis.com/storage/v1"
DEFAULT_MAX_DOCUMENT_BYTES = 64 << 20
DRAIN_BYTES = 64 << 10
"""Bodies of error answers up to this size are read so their connection can be reused."""
_RETRYABLE_STATUS = frozenset({408, 425, 429})
_USER_AGENT = "psyche-py-data/0.1"
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
T = TypeVar("T")


@dataclass(frozen=True)
class HttpOptions:
    """Network settings shared by the HTTP-based providers (times in seconds)."""

    connect_timeout: float = 5.0
    read_timeout: float = 5.0
    request_timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_concurrent_requests: int = 8
    head_concurrency: int = 3
    keepalive_expiry: float = 30.0
    gcs_api_base: str = GCS_JSON_API

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "read_timeout", "request_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HttpOptions.{name} must be positive, got {getattr(self, name)}")
        for name in ("max_concurrent_requests", "head_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"HttpOptions.{name} must be at least 1, got {getattr(self, name)}"
                )
        if self.keepalive_expiry < 0:
            raise ValueError(
                f"HttpOptions.keepalive_expiry must be >= 0, got {self.keepalive_expiry}"
            )


def check_url(url: str) -> None:
    """Refuse anything but an http(s) URL with a host."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise DataFetchError(
            f"unsupported URL {url!r}: expected http:// or https://", retryable=False
        )


def status_error(method: str, url: str, response: httpx.Response) -> DataFetchError:
    """The error for an unwanted status: retryable for 408/425/429 and 5xx, else permanent."""
    code = response.status_code
    where = f"{method} {url}"
    if str(response.url) != url:
        where += f" (redirected to {response.url})"
    return DataFetchError(
        f"HTTP {code} {response.reason_phrase} for {where}",
        retryable=code in _RETRYABLE_STATUS or code >= 500,
    )


def check_content_range(header: str | None, url: str, first: int, last: int) -> None:
    """A 206 must carry ``Content-Range: bytes first-last/...`` for exactly the bytes asked for."""
    match = _CONTENT_RANGE.fullmatch(header.strip()) if header else None
    if match is None:
        raise DataFetchError(
            f"{url} answered bytes {first}-{last} with 206 but Content-Range {header!r}",
            retryable=False,
        )
    got_first, got_last = int(match[1]), int(match[2])
    if (got_first, got_last) != (first, last):
        raise DataFetchError(
            f"{url} answered bytes {got_first}-{got_last} for the requested bytes {first}-{last}",
            retryable=False,
        )


def transport_error(
    method: str, url: str, error: Exception, options: HttpOptions
) -> DataFetchError:
    """A ``DataFetchError`` for an httpx failure: timeouts and network errors are retryable."""
    detail = str(error) or type(error).__name__
    if isinstance(error, httpx.ConnectTimeout):
        return DataFetchError(f"connecting to {url} timed out after {options.connect_timeout} s")
    if isinstance(error, httpx.ReadTimeout):
        return DataFetchError(f"{method} {url} timed out: no data for {options.read_timeout} s")
    if isinstance(error, httpx.TimeoutException):
        return DataFetchError(f"{method} {url} timed out ({type(error).__name__})")
    if isinstance(error, httpx.ConnectError):
        return DataFetchError(f"cannot reach {url}: {detail}")
    permanent = (
        httpx.InvalidURL,
        httpx.LocalProtocolError,
        httpx.UnsupportedProtocol,
        httpx.TooManyRedirects,
    )
    if isinstance(error, permanent):
        return DataFetchError(f"{method} {url} failed: {detail}", retryable=False)
    return DataFetchError(f"{method} {url} failed: {detail}")


async def read_at_most(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The body from ``chunks``, stopping once it is longer than ``limit`` (at most one chunk
    more is read, so callers can tell "exactly limit" from "more than limit")."""
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            break
    return bytes(body)


async def drain(response: httpx.Response) -> None:
    """Read a short remaining body (HEAD answers, error pages) so the connection returns to the
    pool; a longer one is left unread and its connection is closed with the response."""
    await read_at_most(response.aiter_raw(), DRAIN_BYTES)


class HttpSession:
    """A pooled keep-alive HTTP client for one provider (or one mixture of providers)."""

    def __init__(self, options: HttpOptions | None = None) -> None:
        self.options = options or HttpOptions()
        opts = self.options
        self._client = httpx.AsyncClient(
            http1=True,
            http2=False,
            follow_redirects=True,
            headers={"User-Agent": _USER_AGENT},
            timeout=httpx.Timeout(
                connect=opts.connect_timeout,
                read=opts.read_timeout,
                write=opts.read_timeout,
                pool=opts.connect_timeout,
            ),
            limits=httpx.Limits(
                max_connections=opts.max_concurrent_requests,
                max_keepalive_connections=opts.max_concurrent_requests,
                keepalive_expiry=opts.keepalive_expiry,
            ),
        )
        self._requests = asyncio.Semaphore(opts.max_concurrent_requests)
        self._closed = False

    async def _request(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        handle: Callable[[httpx.Response], Awaitable[T]],
        what: str,
    ) -> T:
        """Send ``method url`` and let ``handle`` read the streamed response, retried on
        transient failures; the response is closed (its connection pooled if fully read)."""
        check_url(url)
        deadline = self.options.request_timeout

        async def attempt() -> T:
            if self._closed:
                raise DataFetchError(f"{what}: the HTTP session is closed", retryable=False)
            async with self._requests:
                try:
                    async with (
                        asyncio.timeout(deadline),
                        self._client.stream(method, url, headers=headers) as response,
                    ):
                        return await handle(response)
                except TimeoutError:
                    raise DataFetchError(
                        f"{method} {url} timed out after {deadline} s (whole request)"
                    ) from None
                except (httpx.HTTPError, httpx.InvalidURL) as exc:
                    raise transport_error(method, url, exc, self.options) from None

        return await retry_async(attempt, self.options.retry, what)

    async def head_content_length(self, url: str) -> int:
        """Size of the resource at ``url`` from a HEAD request's Content-Length."""

        async def handle(response: httpx.Response) -> int:
            await drain(response)
            if not response.is_success:
                raise status_error("HEAD", url, response)
            length = response.headers.get("Content-Length")
            if length is None or not length.strip().isdigit():
                raise DataFetchError(
                    f"URL validation failed: HEAD {url} gave no Content-Length", retryable=False
                )
            return int(length)

        # identity: the size of the bytes a ranged read addresses, not of a compressed form
        headers = {"Accept-Encoding": "identity"}
        return await self._request("HEAD", url, headers, handle, f"HEAD {url}")

    async def get_range(self, url: str, start: int, length: int) -> bytes:
        """Exactly ``length`` bytes of ``url`` from byte ``start`` (a ranged GET).

        A 206 must name exactly these bytes in Content-Range. A 200 (the server ignored
        ``Range``) is accepted only when the whole resource is exactly the requested range;
        otherwise it is refused without reading the body.
        """
        if length <= 0:
            return b""
        last = start + length - 1

        async def handle(response: httpx.Response) -> bytes:
            if response.status_code == 206:
                check_content_range(response.headers.get("Content-Range"), url, start, last)
            elif response.status_code == 200:
                declared = response.headers.get("Content-Length")
                if start != 0 or (declared is not None and declared.strip() != str(length)):
                    raise DataFetchError(
                        f"{url} ignored the Range header (status 200 instead of 206 for bytes "
                        f"{start}-{last}); ranged reads need a server that supports them",
                        retryable=False,
                    )
            else:
                await drain(response)
                raise status_error("GET", url, response)
            encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise DataFetchError(
                    f"{url} sent bytes {start}-{last} with Content-Encoding {encoding!r}; token "
                    "files must be served unencoded",
                    retryable=False,
                )
            body = await read_at_most(response.aiter_raw(), length)
            if len(body) > length and response.status_code == 200:
                raise DataFetchError(
                    f"{url} ignored the Range header (status 200 instead of 206): it sent more "
                    f"than the {length} bytes asked for",
                    retryable=False,
                )
            if len(body) != length:
                raise DataFetchError(
                    f"Received unexpected number of bytes from {url}: {len(body)} instead of "
                    f"{length} (bytes {start}-{last})"
                )
            return body

        headers = {"Range": f"bytes={start}-{last}", "Accept-Encoding": "identity"}
        return await self._request("GET", url, headers, handle, f"GET {url} bytes {start}-{last}")

    async def get_document(self, url: str, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> bytes:
        """The whole body at ``url`` (configs, bucket listings), at most ``max_bytes``."""

        async def handle(response: httpx.Response) -> bytes:
            if not response.is_success:
                await drain(response)
                raise status_error("GET", url, response)
            declared = response.headers.get("Content-Length", "").strip()
            too_big = declared.isdigit() and int(declared) > max_bytes
            body = b"" if too_big else await read_at_most(response.aiter_bytes(), max_bytes)
            if too_big or len(body) > max_bytes:
                raise DataFetchError(
                    f"GET {url}: the document is larger than {max_bytes} bytes", retryable=False
                )
            return body

        return await self._request("GET", url, {}, handle, f"GET {url}")

    async def aclose(self) -> None:
        """Close every pooled connection; later requests fail with a ``DataFetchError``.
        Closing twice is harmless (providers of one mixture share a session)."""
        self._closed = True
        await self._client.aclose()
