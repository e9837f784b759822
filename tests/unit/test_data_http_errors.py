"""How HTTP failures become DataFetchErrors: the message names method and URL, and the
``retryable`` flag follows the status or the kind of transport failure."""

from __future__ import annotations

import httpx
import pytest
from psyche_common.data.errors import DataFetchError
from psyche_common.data.http_client import (
    HttpOptions,
    check_content_range,
    check_url,
    status_error,
    transport_error,
)

URL = "http://h/a.ds"
OPTIONS = HttpOptions(connect_timeout=1.5, read_timeout=2.5)


@pytest.mark.parametrize(
    ("error", "message", "retryable"),
    [
        (httpx.ConnectTimeout(""), "connecting to http://h/a.ds timed out after 1.5 s", True),
        (httpx.ReadTimeout(""), "GET http://h/a.ds timed out: no data for 2.5 s", True),
        (httpx.PoolTimeout(""), "GET http://h/a.ds timed out (PoolTimeout)", True),
        (httpx.ConnectError("refused"), "cannot reach http://h/a.ds: refused", True),
        (httpx.ReadError(""), "GET http://h/a.ds failed: ReadError", True),
        (
            httpx.RemoteProtocolError("Server disconnected"),
            "GET http://h/a.ds failed: Server disconnected",
            True,
        ),
        (httpx.TooManyRedirects("Exceeded"), "GET http://h/a.ds failed: Exceeded", False),
        (httpx.UnsupportedProtocol("gopher"), "GET http://h/a.ds failed: gopher", False),
        (httpx.InvalidURL("bad host"), "GET http://h/a.ds failed: bad host", False),
    ],
)
def test_transport_errors(error: Exception, message: str, retryable: bool) -> None:
    result = transport_error("GET", URL, error, OPTIONS)
    assert str(result) == message and result.retryable is retryable


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(404, False), (403, False), (416, False), (408, True), (429, True), (500, True), (503, True)],
)
def test_status_errors(status: int, retryable: bool) -> None:
    response = httpx.Response(status, request=httpx.Request("GET", URL))
    error = status_error("GET", URL, response)
    assert str(error).startswith(f"HTTP {status} ") and str(error).endswith(f"for GET {URL}")
    assert error.retryable is retryable


def test_a_redirected_failure_names_both_urls() -> None:
    response = httpx.Response(404, request=httpx.Request("GET", "http://cdn/a.ds"))
    assert "for GET http://h/a.ds (redirected to http://cdn/a.ds)" in str(
        status_error("GET", URL, response)
    )


def test_content_range_must_name_the_requested_bytes() -> None:
    check_content_range("bytes 4-7/32", URL, 4, 7)
    check_content_range("bytes 4-7/*", URL, 4, 7)
    with pytest.raises(DataFetchError, match="answered bytes 6-9 for the requested bytes 4-7"):
        check_content_range("bytes 6-9/32", URL, 4, 7)
    with pytest.raises(DataFetchError, match="with 206 but Content-Range None") as info:
        check_content_range(None, URL, 4, 7)
    assert info.value.retryable is False
    with pytest.raises(DataFetchError, match="Content-Range 'items 4-7'"):
        check_content_range("items 4-7", URL, 4, 7)


def test_only_http_urls_with_a_host_are_fetched() -> None:
    check_url("https://storage.googleapis.com/b/o")
    for url in ("ftp://h/a.ds", "http://", "/local/path.ds"):
        with pytest.raises(DataFetchError, match="unsupported URL"):
            check_url(url)
