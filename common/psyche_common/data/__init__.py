"""Training data: token files, data providers and the ``psyche-data`` CLI.

A provider serves ``get_samples(BatchId) -> int64 array (len(batch), seq_len)``; build one from
a config ``data_location`` with ``make_provider``. Modules: ``token_files`` (memory-mapped
reader), ``sequence_index`` (sequence table and seeded shuffle), ``local``, ``http`` (+ ``http_client``), ``weighted``, ``dummy``,
``builtin`` (python-stdlib corpus), ``preprocessed`` (parquet), ``retry``, ``tokenize`` and
``cli``. Nothing here imports torch.
"""

from psyche_common.data.errors import DataError, DataFetchError, DataFileError, DataIndexError
from psyche_common.data.provider import (
    DataProvider,
    ServerProviderFactory,
    make_provider,
    parse_data_location,
    provider_from_location,
)
from psyche_common.data.retry import RetryPolicy, get_samples_with_retries

__all__ = [
    "DataError",
    "DataFetchError",
    "DataFileError",
    "DataIndexError",
    "DataProvider",
    "RetryPolicy",
    "ServerProviderFactory",
    "get_samples_with_retries",
    "make_provider",
    "parse_data_location",
    "provider_from_location",
]
