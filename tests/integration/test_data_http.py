"""HTTP provider (and the weighted HTTP mixture) against a local Range-capable HTTP/1.1 server
that counts the TCP connections it accepts."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from psyche_common.batch_id import BatchId
from psyche_common.config.data_location import Gcp, HttpData, NumberedFiles, SingleUrl
from psyche_common.data.errors import DataFetchError, DataFileError, DataIndexError
from psyche_common.data.fetcher import DataSource, SampleFetcher
from psyche_common.data.http import HttpDataProvider, numbered_urls
from psyche_common.data.http_client import HttpOptions, HttpSession
from psyche_common.data.retry import RetryPolicy

FAST = HttpOptions(
    connect_timeout=1.0,
    read_timeout=1.0,
    request_timeout=2.0,
    retry=RetryPolicy(attempts=3, delay_step=0.01),
)


@dataclass
class ServerState:
    files: dict[str, bytes] = field(default_factory=dict)
    fail_times: dict[str, int] = field(default_factory=dict)  # path -> 503s left to send
    delay: dict[str, float] = field(default_factory=dict)
    ignore_range: set[str] = field(default_factory=set)
    no_length: set[str] = field(default_factory=set)
    shift_range: set[str] = field(default_factory=set)  # 206 for other bytes than asked
    trickle: dict[str, float] = field(default_factory=dict)  # seconds between body bytes
    drop_after_reply: bool = False  # close every connection after one answer, silently
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    connections: int = 0  # TCP connections accepted so far
    open_connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, like real file servers

    def log_message(self, format: str, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.state.lock:
            self.server.state.connections += 1
            self.server.state.open_connections += 1

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.state.lock:
                self.server.state.open_connections -= 1

    def _route(self, send_body: bool) -> None:
        state = self.server.state
        url = urllib.parse.urlsplit(self.path)
        with state.lock:
            state.requests.append((self.command, url.path, self.headers.get("Range")))
            failures = state.fail_times.get(url.path, 0)
            if failures:
                state.fail_times[url.path] = failures - 1
        time.sleep(state.delay.get(url.path, 0.0))
        if failures:
            return self._reply(503, b"busy", send_body)
        if url.path.startswith("/storage/v1/b/"):
            return self._gcs_listing(url, send_body)
        body = state.files.get(url.path)
        if body is None:
            return self._reply(404, b"not found", send_body)
        byte_range = self.headers.get("Range")
        if byte_range and url.path not in state.ignore_range:
            first, last = (int(n) for n in byte_range.removeprefix("bytes=").split("-"))
            if url.path in state.shift_range:
                first, last = first + 2, last + 2
            last = min(last, len(body) - 1)
            content_range = f"bytes {first}-{last}/{len(body)}"
            return self._reply(206, body[first : last + 1], send_body, url.path, content_range)
        return self._reply(200, body, send_body, url.path)

    def _gcs_listing(self, url: urllib.parse.SplitResult, send_body: bool) -> None:
        bucket = urllib.parse.unquote(url.path.split("/")[4])
        query = urllib.parse.parse_qs(url.query)
        prefix = query.get("prefix", [""])[0]
        start = int(query.get("pageToken", ["0"])[0])
        names = sorted(
            p.removeprefix(f"/{bucket}/")
            for p in self.server.state.files
            if p.startswith(f"/{bucket}/{prefix}")
        )
        page = names[start : start + 2]  # two objects per page: paging is exercised
        host = f"http://127.0.0.1:{self.server.server_port}"
        listing: dict[str, object] = {
            "kind": "storage#objects",
            "items": [
                {
                    "name": name,
                    "size": str(len(self.server.state.files[f"/{bucket}/{name}"])),
                    "mediaLink": f"{host}/{bucket}/{name}",
                }
                for name in page
            ],
        }
        if start + 2 < len(names):
            listing["nextPageToken"] = str(start + 2)
        self._reply(200, json.dumps(listing).encode(), send_body)

    def _reply(
        self,
        status: int,
        body: bytes,
        send_body: bool,
        path: str | None = None,
        content_range: str | None = None,
    ) -> None:
        state = self.server.state
        self.send_response(status)
        if path is None or path not in state.no_length:
            self.send_header("Content-Length", str(len(body)))
        else:
            self.send_header("Connection", "close")  # the body ends when the connection does
            self.close_connection = True
        if content_range is not None:
            self.send_header("Content-Range", content_range)
        self.end_headers()
        if send_body and path in state.trickle:
            for index in range(len(body)):
                self.wfile.write(body[index : index + 1])
                self.wfile.flush()
                time.sleep(state.trickle[path])
        elif send_body:
            self.wfile.write(body)
        if state.drop_after_reply:
            self.close_connection = True

    def do_GET(self) -> None:
        self._route(send_body=True)

    def do_HEAD(self) -> None:
        self._route(send_body=False)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: ServerState

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients that time out close their sockets mid-reply on purpose


@pytest.fixture
def server() -> Iterator[tuple[str, ServerState]]:
    httpd = _Server(("127.0.0.1", 0), Handler)
    httpd.state = ServerState()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}", httpd.state
    finally:
        httpd.shutdown()
        httpd.server_close()


def reference_files(state: ServerState) -> None:
    """The reference test's files: 000.ds = bytes 0..15, 001.ds = bytes 16..31."""
    state.files["/000.ds"] = bytes(range(16))
    state.files["/001.ds"] = bytes(range(16, 32))


def test_numbered_urls_pads_and_validates() -> None:
    assert numbered_urls("http://h/{}.ds", 0, 3, 2) == ["http://h/000.ds", "http://h/001.ds"]
    assert numbered_urls("http://h/{}.ds", 9, 0, 2) == ["http://h/9.ds", "http://h/10.ds"]
    with pytest.raises(DataFileError, match="expected 1 set of"):
        numbered_urls("http://h/{}/{}.ds", 0, 3, 2)
    with pytest.raises(DataFileError, match="expected 1 set of"):
        numbered_urls("http://h/x.ds", 0, 3, 2)


async def test_numbered_files_like_the_reference(server: tuple[str, ServerState]) -> None:
    base, state = server
    reference_files(state)
    location = NumberedFiles(
        url_template=f"{base}/{{}}.ds", start_index=0, n_left_pad_zeros=3, num_files=2
    )
    provider = await HttpDataProvider.from_location(location, "TwoBytes", 3, options=FAST)
    try:
        # every full sequence: 16 bytes hold two 6-byte sequences per file
        assert provider.num_sequences == 4
        assert (await provider.get_samples(BatchId(0, 0))).tolist() == [[256, 770, 1284]]
        assert (await provider.get_samples(BatchId(1, 1))).tolist() == [[1798, 2312, 2826]]
        both = await provider.get_samples(BatchId(1, 2))
        assert both.dtype == np.int64
        assert both[1].tolist() == [4368, 4882, 5396]  # first sequence of 001.ds
        with pytest.raises(DataIndexError, match="index 4 is out of bounds"):
            await provider.get_samples(BatchId(3, 4))
    finally:
        await provider.aclose()
    heads = [r for r in state.requests if r[0] == "HEAD"]
    assert sorted(r[1] for r in heads) == ["/000.ds", "/001.ds"]


async def test_contiguous_sequences_are_one_ranged_get(server: tuple[str, ServerState]) -> None:
    base, state = server
    state.files["/big.bin"] = np.arange(40, dtype="<u2").tobytes()
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/big.bin"), 2, 4, options=FAST
    )
    state.requests.clear()
    samples = await provider.get_samples(BatchId(2, 6))
    assert samples.tolist() == [list(range(i * 4, i * 4 + 4)) for i in range(2, 7)]
    assert state.requests == [("GET", "/big.bin", "bytes=16-55")]
    await provider.aclose()


async def test_shuffled_providers_agree(server: tuple[str, ServerState]) -> None:
    base, state = server
    state.files["/a.ds"] = np.arange(200, dtype="<u2").tobytes()
    url = SingleUrl(url=f"{base}/a.ds")
    seed = {"Seeded": [42] * 32}
    one = await HttpDataProvider.from_location(url, 2, 4, seed, options=FAST)
    two = await HttpDataProvider.from_location(url, 2, 4, seed, options=FAST)
    plain = await HttpDataProvider.from_location(url, 2, 4, options=FAST)
    first = await one.get_samples(BatchId(0, 9))
    assert first.tolist() == (await two.get_samples(BatchId(0, 9))).tolist()
    assert first.tolist() != (await plain.get_samples(BatchId(0, 9))).tolist()
    for provider in (one, two, plain):
        await provider.aclose()


async def test_from_config_model(server: tuple[str, ServerState]) -> None:
    base, state = server
    reference_files(state)
    config = HttpData.model_validate(
        {
            "location": {"SingleUrl": f"{base}/001.ds"},
            "token_size_in_bytes": "TwoBytes",
            "shuffle": "DontShuffle",
        }
    )
    provider = await HttpDataProvider.from_config(config, 3, FAST)
    assert (await provider.get_samples(BatchId(0, 0))).tolist() == [[4368, 4882, 5396]]
    await provider.aclose()


async def test_gcs_listing_with_paging(server: tuple[str, ServerState]) -> None:
    base, state = server
    for index in range(5):
        state.files[f"/bucket/tokens/{index:03}.bin"] = np.full(8, index, "<u2").tobytes()
    state.files["/bucket/tokens/README.md"] = b"ignored"
    state.files["/bucket/other/x.bin"] = b"\0\0" * 8
    options = HttpOptions(retry=FAST.retry, gcs_api_base=f"{base}/storage/v1")
    location = Gcp(bucket_name="bucket", filter_directory="tokens/")
    provider = await HttpDataProvider.from_location(location, 2, 8, options=options)
    assert [f.url.rsplit("/", 1)[1] for f in provider.files] == [f"{i:03}.bin" for i in range(5)]
    samples = await provider.get_samples(BatchId(0, 4))
    assert samples[:, 0].tolist() == [0, 1, 2, 3, 4]
    listings = [r for r in state.requests if r[1].startswith("/storage")]
    assert len(listings) == 3  # 6 objects under the prefix, 2 per page (README is filtered)
    await provider.aclose()


async def test_404_fails_fast_naming_the_url(server: tuple[str, ServerState]) -> None:
    base, state = server
    with pytest.raises(DataFetchError, match=r"HTTP 404 .*HEAD .*/missing\.ds"):
        await HttpDataProvider.from_location(
            SingleUrl(url=f"{base}/missing.ds"), 2, 4, options=FAST
        )
    assert len(state.requests) == 1  # no retries for a permanent answer


async def test_missing_content_length_is_rejected(server: tuple[str, ServerState]) -> None:
    base, state = server
    state.files["/x.ds"] = b"\0" * 16
    state.no_length.add("/x.ds")
    with pytest.raises(DataFetchError, match="no Content-Length"):
        await HttpDataProvider.from_location(SingleUrl(url=f"{base}/x.ds"), 2, 4, options=FAST)


async def test_503_is_retried_until_it_succeeds(server: tuple[str, ServerState]) -> None:
    base, state = server
    reference_files(state)
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/000.ds"), 2, 3, options=FAST
    )
    state.fail_times["/000.ds"] = 2
    state.requests.clear()
    assert (await provider.get_samples(BatchId(0, 0))).tolist() == [[256, 770, 1284]]
    assert len(state.requests) == 3
    assert state.connections == 1  # error pages are drained: their connection is reused
    await provider.aclose()


async def test_gives_up_after_the_configured_attempts(server: tuple[str, ServerState]) -> None:
    base, state = server
    reference_files(state)
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/000.ds"), 2, 3, options=FAST
    )
    state.fail_times["/000.ds"] = 100
    state.requests.clear()
    with pytest.raises(DataFetchError, match=r"failed after 3 attempts: HTTP 503") as info:
        await provider.get_samples(BatchId(0, 0))
    assert info.value.retryable is False
    assert len(state.requests) == 3
    await provider.aclose()


async def test_timeouts_are_retried(server: tuple[str, ServerState]) -> None:
    base, state = server
    reference_files(state)
    options = HttpOptions(read_timeout=0.2, retry=RetryPolicy(attempts=2, delay_step=0.01))
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/000.ds"), 2, 3, options=options
    )
    state.delay["/000.ds"] = 0.6
    state.requests.clear()
    with pytest.raises(DataFetchError, match=r"failed after 2 attempts: .*no data for 0\.2 s"):
        await provider.get_samples(BatchId(0, 0))
    assert len([r for r in state.requests if r[0] == "GET"]) == 2
    await provider.aclose()


async def test_server_ignoring_range_is_an_error(server: tuple[str, ServerState]) -> None:
    base, state = server
    reference_files(state)
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/000.ds"), 2, 3, options=FAST
    )
    state.ignore_range.add("/000.ds")
    with pytest.raises(DataFetchError, match="ignored the Range header"):
        await provider.get_samples(BatchId(1, 1))
    await provider.aclose()


def test_http_options_are_validated() -> None:
    with pytest.raises(ValueError, match=r"HttpOptions\.read_timeout must be positive"):
        HttpOptions(read_timeout=0)
    with pytest.raises(ValueError, match=r"HttpOptions\.max_concurrent_requests must be at least"):
        HttpOptions(max_concurrent_requests=0)


async def test_unreachable_server_and_bad_scheme() -> None:
    options = HttpOptions(connect_timeout=0.5, retry=RetryPolicy(attempts=2, delay_step=0))
    session = HttpSession(options)
    try:
        with pytest.raises(DataFetchError, match="failed after 2 attempts: cannot reach"):
            await session.head_content_length("http://127.0.0.1:9/x.ds")
        with pytest.raises(DataFetchError, match="unsupported URL") as info:
            await session.head_content_length("ftp://example.com/x.ds")
        assert info.value.retryable is False
    finally:
        await session.aclose()


async def test_ranged_reads_reuse_one_keep_alive_connection(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    state.files["/big.bin"] = np.arange(40, dtype="<u2").tobytes()
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/big.bin"), 2, 4, options=FAST
    )
    try:
        for index in (0, 7, 3, 9, 5):
            samples = await provider.get_samples(BatchId(index, index))
            assert samples.tolist() == [list(range(index * 4, index * 4 + 4))]
    finally:
        await provider.aclose()
    assert [r[0] for r in state.requests] == ["HEAD"] + ["GET"] * 5
    assert state.connections == 1  # the HEAD's connection served every ranged GET


async def test_concurrent_reads_stay_within_the_connection_limit(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    state.files["/a.ds"] = np.arange(400, dtype="<u2").tobytes()
    state.delay["/a.ds"] = 0.02  # requests overlap
    options = HttpOptions(read_timeout=1.0, retry=FAST.retry, max_concurrent_requests=2)
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/a.ds"), 2, 4, {"Seeded": [7] * 32}, options=options
    )
    try:
        for _ in range(3):
            assert (await provider.get_samples(BatchId(0, 19))).shape == (20, 4)
    finally:
        await provider.aclose()
    assert len(state.requests) > 20  # shuffled: many separate ranged GETs
    assert 1 <= state.connections <= 2


async def test_a_server_closing_idle_connections_does_not_break_reads(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    reference_files(state)
    state.drop_after_reply = True
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/000.ds"), 2, 3, options=FAST
    )
    try:
        for _ in range(4):
            assert (await provider.get_samples(BatchId(0, 0))).tolist() == [[256, 770, 1284]]
    finally:
        await provider.aclose()
    assert state.connections == 5  # one per answer: a closed connection is never reused


async def test_a_trickling_answer_hits_the_whole_request_deadline(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    state.files["/slow.ds"] = bytes(40)
    options = HttpOptions(
        read_timeout=1.0, request_timeout=0.3, retry=RetryPolicy(attempts=1, delay_step=0)
    )
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/slow.ds"), 2, 20, options=options
    )
    state.trickle["/slow.ds"] = 0.05  # a byte every 50 ms: never silent for read_timeout
    try:
        with pytest.raises(DataFetchError, match=r"slow\.ds timed out after 0\.3 s \(whole"):
            await provider.get_samples(BatchId(0, 0))
    finally:
        await provider.aclose()


async def test_ignored_range_for_the_whole_file_is_accepted(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    state.files["/one.ds"] = np.arange(4, dtype="<u2").tobytes()  # exactly one sequence
    state.ignore_range.add("/one.ds")
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/one.ds"), 2, 4, options=FAST
    )
    try:
        assert (await provider.get_samples(BatchId(0, 0))).tolist() == [[0, 1, 2, 3]]
    finally:
        await provider.aclose()


async def test_a_partial_read_refused_by_an_ignored_range_is_not_retried(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    state.files["/two.ds"] = np.arange(8, dtype="<u2").tobytes()
    state.ignore_range.add("/two.ds")
    session = HttpSession(FAST)
    try:
        # the first half: the 200 is the whole file, more than the 8 bytes asked for
        with pytest.raises(DataFetchError, match=r"two\.ds ignored the Range header") as info:
            await session.get_range(f"{base}/two.ds", 0, 8)
        assert info.value.retryable is False
    finally:
        await session.aclose()
    assert len(state.requests) == 1


async def test_a_206_for_other_bytes_is_refused(server: tuple[str, ServerState]) -> None:
    base, state = server
    state.files["/shift.ds"] = bytes(range(32))
    state.shift_range.add("/shift.ds")
    session = HttpSession(FAST)
    try:
        with pytest.raises(
            DataFetchError, match=r"shift\.ds answered bytes 6-9 for the requested bytes 4-7"
        ):
            await session.get_range(f"{base}/shift.ds", 4, 4)
    finally:
        await session.aclose()
    assert len(state.requests) == 1  # permanent: not retried


async def test_documents_are_bounded(server: tuple[str, ServerState]) -> None:
    base, state = server
    state.files["/config.json"] = b"x" * 100
    session = HttpSession(FAST)
    try:
        assert await session.get_document(f"{base}/config.json", max_bytes=100) == b"x" * 100
        with pytest.raises(DataFetchError, match=r"config\.json: the document is larger than 99"):
            await session.get_document(f"{base}/config.json", max_bytes=99)
    finally:
        await session.aclose()


async def test_aclose_closes_the_connections_and_later_reads_fail(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    reference_files(state)
    provider = await HttpDataProvider.from_location(
        SingleUrl(url=f"{base}/000.ds"), 2, 3, options=FAST
    )
    await provider.get_samples(BatchId(0, 0))
    assert state.open_connections == 1
    await provider.aclose()
    await provider.aclose()  # twice is harmless (a mixture's providers share a session)
    for _ in range(100):
        if state.open_connections == 0:
            break
        await asyncio.sleep(0.02)
    assert state.open_connections == 0
    with pytest.raises(DataFetchError, match="the HTTP session is closed") as info:
        await provider.get_samples(BatchId(0, 0))
    assert info.value.retryable is False


async def test_the_sample_fetcher_reads_http_data_and_closes_its_session(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    reference_files(state)
    location = {
        "Http": {
            "location": {"SingleUrl": f"{base}/000.ds"},
            "token_size_in_bytes": "TwoBytes",
            "shuffle": "DontShuffle",
        }
    }
    fetcher = SampleFetcher(DataSource(location, 3), None, FAST.retry, http_options=FAST)
    samples = await fetcher(BatchId(0, 1))
    assert samples.tolist() == [[256, 770, 1284], [1798, 2312, 2826]]
    assert state.open_connections == 1
    await fetcher.aclose()
    for _ in range(100):
        if state.open_connections == 0:
            break
        await asyncio.sleep(0.02)
    assert state.open_connections == 0


async def test_the_fetcher_policy_bounds_the_http_attempts(
    server: tuple[str, ServerState],
) -> None:
    base, state = server
    reference_files(state)
    location = {
        "Http": {
            "location": {"SingleUrl": f"{base}/000.ds"},
            "token_size_in_bytes": "TwoBytes",
            "shuffle": "DontShuffle",
        }
    }
    fetcher = SampleFetcher(DataSource(location, 3), None, RetryPolicy(attempts=2, delay_step=0))
    try:
        await fetcher(BatchId(0, 0))
        state.fail_times["/000.ds"] = 100
        state.requests.clear()
        with pytest.raises(DataFetchError, match=r"failed after 2 attempts: HTTP 503"):
            await fetcher(BatchId(1, 1))
    finally:
        await fetcher.aclose()
    assert len(state.requests) == 2  # the policy's attempts, not HttpOptions' default 7 (or 2x2)


async def test_wrong_token_size_for_remote_file(server: tuple[str, ServerState]) -> None:
    base, state = server
    state.files["/odd.ds"] = b"\0" * 6
    with pytest.raises(DataFileError, match=r"odd\.ds is 6 bytes.*wrong token size"):
        await HttpDataProvider.from_location(SingleUrl(url=f"{base}/odd.ds"), 4, 1, options=FAST)


async def test_weighted_http_mixture_from_a_json_url(server: tuple[str, ServerState]) -> None:
    from psyche_common.data.weighted import load_weighted_http

    base, state = server
    fills = [[1, 2], [3, 4]]
    for provider, values in enumerate(fills):
        for number, value in enumerate(values):
            state.files[f"/provider_{provider}/{number:03}.ds"] = bytes([value]) * 16
    config = {
        "shuffle": "DontShuffle",
        "providers": [
            [
                {
                    "location": {
                        "NumberedFiles": {
                            "url_template": f"{base}/provider_{provider}/{{}}.ds",
                            "start_index": 0,
                            "n_left_pad_zeros": 3,
                            "num_files": 2,
                        }
                    },
                    "token_size_in_bytes": "TwoBytes",
                    "shuffle": "DontShuffle",
                },
                1.0,
            ]
            for provider in range(2)
        ],
    }
    state.files["/multi_config.json"] = json.dumps(config).encode()
    mixture = await load_weighted_http(f"{base}/multi_config.json", 3, FAST)
    try:
        assert mixture.num_sequences == 8
        samples = await mixture.get_samples(BatchId(0, 7))
        fill_of_row = [int(row[0]) & 0xFF for row in samples]
        assert fill_of_row == [1, 3, 1, 3, 2, 4, 2, 4]
        assert samples[0].tolist() == [0x0101] * 3
        with pytest.raises(DataIndexError, match="index 8 is out of bounds: the mixture has 8"):
            await mixture.get_samples(BatchId(0, 8))
    finally:
        await mixture.aclose()


async def test_weighted_http_config_errors(server: tuple[str, ServerState], tmp_path: Path) -> None:
    from psyche_common.data.weighted import load_weighted_http

    base, state = server
    state.files["/bad.json"] = b"{not json"
    with pytest.raises(DataFileError, match="is not JSON"):
        await load_weighted_http(f"{base}/bad.json", 3, FAST)
    with pytest.raises(DataFetchError, match="HTTP 404"):
        await load_weighted_http(f"{base}/missing.json", 3, FAST)
    with pytest.raises(DataFileError, match="cannot read mixture config"):
        await load_weighted_http(str(tmp_path / "missing.json"), 3, FAST)
