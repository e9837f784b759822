"""The exceptions every data provider raises, so callers can tell bad input from flaky networks.

``DataError`` is the base. ``DataIndexError`` means a requested sample does not exist,
``DataFileError`` means a token file (or its configuration) is unusable, and ``DataFetchError``
means a network read failed; its ``retryable`` flag says whether trying again can help.
"""

from __future__ import annotations


class DataError(Exception):
    """Any failure to provide training data."""


class DataIndexError(DataError, IndexError):
    """A requested sample index is outside the data set."""


class DataFileError(DataError, ValueError):
    """A token file, directory or data configuration cannot be used as given (a ValueError)."""


class DataFetchError(DataError):
    """A remote read failed. ``retryable`` is False for answers that will not change (404)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable
