"""Data locations (`model.LLM.data_location`): where clients read training samples.

TOML forms: `"Dummy"`, `{ Server = "host:port" }`, `{ Local = "path" }`,
`{ WeightedHttp = "url" }`, `{ Preprocessed = "url-or-path" }`, our `{ Builtin = "python-stdlib" }`,
or an `[model.LLM.data_location.Http]` section with `token_size_in_bytes`, `shuffle` and a
`location` that is `{ SingleUrl = "url" }`, `{ NumberedFiles = {...} }` or `{ Gcp = {...} }`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from psyche_common.config._types import U8, U32, ShortStr, UrlStr
from psyche_common.config.enums import TokenSize
from psyche_common.config.tagged import Variant, toml_tagged

# --- shuffling ------------------------------------------------------------------------------


class DontShuffle(Variant):
    """Samples are read in file order."""

    kind: Literal["DontShuffle"] = "DontShuffle"


class SeededShuffle(Variant):
    """One global seeded shuffle of all samples: `{ Seeded = [32 integers 0-255] }`."""

    kind: Literal["Seeded"] = "Seeded"
    SCALAR_FIELD: ClassVar[str | None] = "seed"
    seed: Annotated[tuple[U8, ...], Field(min_length=32, max_length=32)]
    """The shuffle's seed: 32 integers 0-255."""

    @property
    def seed_bytes(self) -> bytes:
        return bytes(self.seed)


AnyShuffle = DontShuffle | SeededShuffle

Shuffle = Annotated[AnyShuffle, *toml_tagged("shuffle", DontShuffle, SeededShuffle)]

# --- HTTP locations -------------------------------------------------------------------------


class SingleUrl(Variant):
    """One token file at a URL."""

    kind: Literal["SingleUrl"] = "SingleUrl"
    SCALAR_FIELD: ClassVar[str | None] = "url"
    url: UrlStr
    """The file's URL; not empty."""


class NumberedFiles(Variant):
    """Files `url_template` with `{}` replaced by start_index.. zero-padded to n_left_pad_zeros."""

    kind: Literal["NumberedFiles"] = "NumberedFiles"
    url_template: ShortStr
    """The files' URL with `{}` where the number goes; not empty."""
    start_index: U32
    """The first file's number."""
    n_left_pad_zeros: U8
    """Width the numbers are zero-padded to."""
    num_files: U32
    """How many files; at least 1."""


class Gcp(Variant):
    """Every token file under `filter_directory` of a public GCS bucket."""

    kind: Literal["Gcp"] = "Gcp"
    bucket_name: ShortStr
    """The public bucket; not empty."""
    filter_directory: UrlStr
    """The folder of the bucket whose token files are read."""


AnyHttpLocation = SingleUrl | NumberedFiles | Gcp

HttpLocation = Annotated[
    AnyHttpLocation, *toml_tagged("HTTP location", SingleUrl, NumberedFiles, Gcp)
]

# --- data locations -------------------------------------------------------------------------


class DummyData(Variant):
    """Synthetic samples (no data needed)."""

    kind: Literal["Dummy"] = "Dummy"

    def __str__(self) -> str:
        return "Dummy"


class ServerData(Variant):
    """The run's TCP data server at `host:port`."""

    kind: Literal["Server"] = "Server"
    SCALAR_FIELD: ClassVar[str | None] = "address"
    address: ShortStr
    """`host:port` of the data server (`psyche-server run --data-config`); not empty."""

    def __str__(self) -> str:
        return f"data server {self.address}"


class LocalData(Variant):
    """Token files in a local directory on every client."""

    kind: Literal["Local"] = "Local"
    SCALAR_FIELD: ClassVar[str | None] = "path"
    path: UrlStr
    """The directory of token files (or a data.toml) on every client."""

    def __str__(self) -> str:
        return f"local files {self.path}"


class HttpData(Variant):
    """Token files fetched over HTTP with ranged reads."""

    kind: Literal["Http"] = "Http"
    location: HttpLocation
    """Which files: one URL, numbered files or a GCS folder."""
    token_size_in_bytes: TokenSize
    """Token width in the files (TwoBytes: u16, FourBytes: u32, little-endian)."""
    shuffle: Shuffle
    """Whether (and with which seed) all samples are shuffled once."""

    def __str__(self) -> str:
        location = self.location
        if isinstance(location, SingleUrl):
            where = location.url
        elif isinstance(location, NumberedFiles):
            where = f"{location.url_template} x{location.num_files}"
        else:
            where = f"gs://{location.bucket_name}/{location.filter_directory}"
        return f"HTTP {where}"


class WeightedHttpData(Variant):
    """A weighted mixture of HTTP sources described by a JSON file at `url`."""

    kind: Literal["WeightedHttp"] = "WeightedHttp"
    SCALAR_FIELD: ClassVar[str | None] = "url"
    url: UrlStr
    """The URL of the JSON file naming the sources and their weights; not empty."""

    def __str__(self) -> str:
        return f"weighted HTTP mixture {self.url}"


class PreprocessedData(Variant):
    """Parquet rows from a Hub dataset or local path."""

    kind: Literal["Preprocessed"] = "Preprocessed"
    SCALAR_FIELD: ClassVar[str | None] = "url"
    url: UrlStr
    """The Hub dataset or local path of the parquet files (an `inputs` column); not empty."""

    def __str__(self) -> str:
        return f"preprocessed parquet {self.url}"


BUILTIN_DATASETS: tuple[str, ...] = ("python-stdlib",)
"""Names of the `{ Builtin = ... }` corpora the data providers know."""


class BuiltinData(Variant):
    """Our addition: a corpus built on the client from local files (e.g. `python-stdlib`)."""

    kind: Literal["Builtin"] = "Builtin"
    SCALAR_FIELD: ClassVar[str | None] = "name"
    name: ShortStr
    """The corpus (`python-stdlib`); another name is a warning."""

    def __str__(self) -> str:
        return f"builtin corpus {self.name}"


DATA_LOCATION_VARIANTS = (
    DummyData,
    ServerData,
    LocalData,
    HttpData,
    WeightedHttpData,
    PreprocessedData,
    BuiltinData,
)

AnyDataLocation = (
    DummyData
    | ServerData
    | LocalData
    | HttpData
    | WeightedHttpData
    | PreprocessedData
    | BuiltinData
)
"""Plain union of the data location classes, for type hints."""

DataLocation = Annotated[AnyDataLocation, *toml_tagged("data location", *DATA_LOCATION_VARIANTS)]
"""`AnyDataLocation` read from and written to its TOML form (use it as a pydantic field type)."""
