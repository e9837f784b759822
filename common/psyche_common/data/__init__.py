"""Training data: token files, data providers and the ``psyche-data`` CLI.

A provider (``provider.DataProvider``) serves ``get_samples(BatchId) -> int64 array
(len(batch), seq_len)``; ``factory.make_provider`` builds one from a config ``data_location``.
``fetcher.SampleFetcher`` is how a client fetches a batch (lazy provider, retries, closing).
Modules: ``provider`` (the protocol), ``factory``, ``fetcher``, ``token_files`` (memory-mapped reader),
``sequence_index`` (sequence table and seeded shuffle), ``local``, ``http`` (+ ``http_client``),
``weighted``, ``dummy``, ``builtin`` (python-stdlib corpus), ``preprocessed`` (parquet),
``server_client`` (the TCP data server's client), ``retry``, ``tokenize`` and ``cli``. Nothing
here imports torch.

This package exports only what imports no provider implementation (the protocol, the errors
and the retry helpers), so importing ``psyche_common.data.provider`` or ``.errors`` stays
light; import ``make_provider`` from ``psyche_common.data.factory``.
"""

from psyche_common.data.errors import DataError, DataFetchError, DataFileError, DataIndexError
from psyche_common.data.provider import DataProvider
from psyche_common.data.retry import RetryPolicy, get_samples_with_retries

__all__ = [
    "DataError",
    "DataFetchError",
    "DataFileError",
    "DataIndexError",
    "DataProvider",
    "RetryPolicy",
    "get_samples_with_retries",
]
