"""The HTTP provider: token files read remotely with ranged GETs.

Locations (the config's ``HttpData.location``): one URL, a numbered template (``{}`` replaced
by zero-padded numbers) or every token file of a public GCS bucket (the JSON API listing, page
by page, sorted by URL). URLs are sized with HEAD requests (three at a time); GCS sizes come
from the listing. All requests go through one ``http_client.HttpSession`` (pooled keep-alive
connections), closed by ``aclose()``. Sequences are cut and shuffled exactly like local files (``token_files``), so
the same seed and file list give the same order everywhere. Every run of consecutive sequences
of one file in a request becomes one ranged GET; the rest are fetched concurrently.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from psyche_common.batch_id import BatchId
from psyche_common.config.data_location import Gcp, HttpData, NumberedFiles, SingleUrl
from psyche_common.config.enums import TokenSize
from psyche_common.data.errors import DataFetchError, DataFileError
from psyche_common.data.http_client import HttpOptions, HttpSession
from psyche_common.data.sequence_index import SequenceTable, parse_shuffle
from psyche_common.data.token_files import DATA_FILE_EXTENSIONS, parse_token_size, token_dtype

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteFile:
    """A token file at ``url`` of ``size`` bytes."""

    url: str
    size: int


def first_error(errors: BaseExceptionGroup) -> BaseException:
    """The first leaf exception of a task group's failure (callers expect a plain error)."""
    error: BaseException = errors
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def numbered_urls(
    url_template: str, start_index: int, n_left_pad_zeros: int, num_files: int
) -> list[str]:
    """``url_template`` with its single ``{}`` replaced by each zero-padded file number."""
    if url_template.count("{}") != 1:
        raise DataFileError(
            f"expected 1 set of {{}} for number substitution in url template {url_template!r}"
        )
    if num_files <= 0:
        raise DataFileError(f"num_files must be positive, got {num_files}")
    return [
        url_template.replace("{}", str(number).zfill(n_left_pad_zeros))
        for number in range(start_index, start_index + num_files)
    ]


async def size_urls(urls: Sequence[str], session: HttpSession) -> list[RemoteFile]:
    """HEAD every URL (``head_concurrency`` at a time) to learn its size."""
    limit = asyncio.Semaphore(session.options.head_concurrency)

    async def size_one(url: str) -> RemoteFile:
        async with limit:
            return RemoteFile(url, await session.head_content_length(url))

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(size_one(url)) for url in urls]
    except BaseExceptionGroup as errors:
        raise first_error(errors) from None
    return [task.result() for task in tasks]


def gcs_listing_url(api_base: str, bucket: str, prefix: str, page_token: str | None) -> str:
    """The JSON API URL listing objects of ``bucket`` under ``prefix`` (one page)."""
    query: dict[str, str] = {}
    if prefix:
        query["prefix"] = prefix
    if page_token:
        query["pageToken"] = page_token
    path = f"{api_base.rstrip('/')}/b/{urllib.parse.quote(bucket, safe='')}/o"
    return f"{path}?{urllib.parse.urlencode(query)}" if query else path


def parse_gcs_page(document: bytes, source: str) -> tuple[list[RemoteFile], str | None]:
    """Token files of one listing page (names ending in npy/bin/ds) and the next page token."""
    try:
        page = json.loads(document)
        files = [
            RemoteFile(item["mediaLink"], int(item["size"]))
            for item in page.get("items", [])
            if str(item["name"]).endswith(tuple(ext.lstrip(".") for ext in DATA_FILE_EXTENSIONS))
        ]
        next_token = page.get("nextPageToken")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataFetchError(
            f"malformed GCS listing from {source}: {exc}", retryable=False
        ) from None
    return files, next_token


async def list_gcs_bucket(bucket: str, prefix: str, session: HttpSession) -> list[RemoteFile]:
    """Every token file of a public bucket under ``prefix``, sorted by URL (anonymous access)."""
    files: list[RemoteFile] = []
    page_token: str | None = None
    while True:
        url = gcs_listing_url(session.options.gcs_api_base, bucket, prefix, page_token)
        page_files, page_token = parse_gcs_page(await session.get_document(url), url)
        files.extend(page_files)
        if not page_token:
            break
    if not files:
        raise DataFileError(f"no token files in gs://{bucket}/{prefix}")
    return sorted(files, key=lambda f: f.url)


async def resolve_location(
    location: SingleUrl | NumberedFiles | Gcp, session: HttpSession
) -> list[RemoteFile]:
    """The files (with sizes) an HTTP location names."""
    if isinstance(location, SingleUrl):
        return await size_urls([location.url], session)
    if isinstance(location, NumberedFiles):
        urls = numbered_urls(
            location.url_template,
            location.start_index,
            location.n_left_pad_zeros,
            location.num_files,
        )
        return await size_urls(urls, session)
    return await list_gcs_bucket(location.bucket_name, location.filter_directory, session)


def contiguous_runs(
    files: np.ndarray, offsets: np.ndarray, seq_len: int
) -> list[tuple[int, int, int]]:
    """Split requested sequences into (first row, row count, file) runs of adjacent sequences."""
    runs: list[tuple[int, int, int]] = []
    for row, (file, offset) in enumerate(zip(files.tolist(), offsets.tolist(), strict=True)):
        if runs:
            first, count, run_file = runs[-1]
            if run_file == file and int(offsets[first]) + count * seq_len == offset:
                runs[-1] = (first, count + 1, file)
                continue
        runs.append((row, 1, file))
    return runs


class HttpDataProvider:
    """Sequences of ``seq_len`` tokens from remote token files."""

    def __init__(
        self,
        files: Sequence[RemoteFile],
        token_size: TokenSize | str | int,
        seq_len: int,
        shuffle: Any = None,
        session: HttpSession | None = None,
    ) -> None:
        if not files:
            raise DataFileError("an HTTP data location needs at least one file")
        self.files = list(files)
        self.token_size = parse_token_size(token_size)
        self.seq_len = seq_len
        self.session = session or HttpSession()
        width = self.token_size.num_bytes
        for file in self.files:
            if file.size % width:
                raise DataFileError(
                    f"{file.url} is {file.size} bytes, not a whole number of {width}-byte "
                    "tokens (wrong token size?)"
                )
        description = self.files[0].url if len(self.files) == 1 else f"{len(self.files)} URLs"
        self.table = SequenceTable(
            [f.size // width for f in self.files], seq_len, parse_shuffle(shuffle), description
        )
        logger.info(
            "HTTP data: %d files, %d sequences of %d tokens",
            len(self.files),
            len(self.table),
            seq_len,
        )

    @classmethod
    async def from_location(
        cls,
        location: SingleUrl | NumberedFiles | Gcp,
        token_size: TokenSize | str | int,
        seq_len: int,
        shuffle: Any = None,
        options: HttpOptions | None = None,
    ) -> HttpDataProvider:
        session = HttpSession(options)
        try:
            files = await resolve_location(location, session)
            return cls(files, token_size, seq_len, shuffle, session)
        except BaseException:
            await session.aclose()
            raise

    @classmethod
    async def from_config(
        cls, config: HttpData, seq_len: int, options: HttpOptions | None = None
    ) -> HttpDataProvider:
        return await cls.from_location(
            config.location, config.token_size_in_bytes, seq_len, config.shuffle, options
        )

    @property
    def num_sequences(self) -> int:
        return len(self.table)

    async def get_samples(self, batch: BatchId) -> np.ndarray:
        files, offsets = self.table.locate_range(batch.start, batch.end)
        out = np.empty((len(files), self.seq_len), dtype=np.int64)
        width = self.token_size.num_bytes
        dtype = token_dtype(self.token_size)

        async def fetch(first: int, count: int, file: int) -> None:
            start = int(offsets[first]) * width
            body = await self.session.get_range(
                self.files[file].url, start, count * self.seq_len * width
            )
            tokens = np.frombuffer(body, dtype=dtype).reshape(count, self.seq_len)
            out[first : first + count] = tokens

        try:
            async with asyncio.TaskGroup() as group:
                for run in contiguous_runs(files, offsets, self.seq_len):
                    group.create_task(fetch(*run))
        except BaseExceptionGroup as errors:
            raise first_error(errors) from None
        return out

    async def aclose(self) -> None:
        """Close the HTTP session (shared by every provider of a mixture)."""
        await self.session.aclose()

    def __repr__(self) -> str:
        return (
            f"HttpDataProvider({len(self.files)} files, {self.token_size.value}, "
            f"seq_len={self.seq_len}, sequences={self.num_sequences})"
        )
