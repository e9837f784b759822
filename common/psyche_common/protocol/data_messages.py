"""Messages of the TCP data server port (same framing and handshake as the coordinator port).

client → server: `RequestTrainingData{start, end}` (an inclusive BatchId of sample indices).
server → client: `TrainingData{start, end, seq_len, tokens}` where `tokens` is the
`(end-start+1) × seq_len` int32 little-endian token matrix as raw bytes, or
`RequestRejected{start, end, reason, detail}` with reason `NotInThisRound` (the requester is not
a client of the current epoch), `OutOfRange` (the provider has no such samples) or `DataError`
(any other provider failure). One request in flight per connection.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, model_validator

from .messages import InvalidMessage, NonNegInt, _Message, _parse

MAX_SAMPLES_PER_REQUEST = 4096
RejectReason = Literal["NotInThisRound", "OutOfRange", "DataError", "TooLarge"]


class RequestTrainingData(_Message):
    """Client → data server: samples `start..end` (inclusive) of the current round."""

    type: Literal["RequestTrainingData"] = "RequestTrainingData"
    start: NonNegInt
    end: NonNegInt

    @model_validator(mode="after")
    def _ordered(self) -> RequestTrainingData:
        if self.end < self.start:
            raise ValueError(f"end ({self.end}) is before start ({self.start})")
        if self.end - self.start + 1 > MAX_SAMPLES_PER_REQUEST:
            raise ValueError(f"at most {MAX_SAMPLES_PER_REQUEST} samples per request")
        return self


class TrainingData(_Message):
    """Data server → client: the samples as little-endian int32 tokens, row-major."""

    type: Literal["TrainingData"] = "TrainingData"
    start: NonNegInt
    end: NonNegInt
    seq_len: Annotated[int, Field(strict=True, ge=1)]
    tokens: bytes

    @model_validator(mode="after")
    def _sized(self) -> TrainingData:
        expected = (self.end - self.start + 1) * self.seq_len * 4
        if self.end < self.start or len(self.tokens) != expected:
            raise ValueError(
                f"tokens hold {len(self.tokens)} bytes, expected {expected} "
                f"for samples [{self.start}, {self.end}] × seq_len {self.seq_len} int32"
            )
        return self


class RequestRejected(_Message):
    """Data server → client: why a request was refused (`reason`, with a `detail` text)."""

    type: Literal["RequestRejected"] = "RequestRejected"
    start: NonNegInt
    end: NonNegInt
    reason: RejectReason
    detail: str = ""


DATA_CLIENT_TYPES = frozenset({"RequestTrainingData"})
DATA_SERVER_TYPES = frozenset({"TrainingData", "RequestRejected"})
_request_adapter: TypeAdapter[RequestTrainingData] = TypeAdapter(RequestTrainingData)
_reply_adapter: TypeAdapter[TrainingData | RequestRejected] = TypeAdapter(
    Annotated[TrainingData | RequestRejected, Field(discriminator="type")]
)


def parse_data_request(obj: object) -> RequestTrainingData:
    """Validate a decoded data-port request; raises `InvalidMessage`."""
    return _parse(_request_adapter, DATA_CLIENT_TYPES, obj)


def parse_data_reply(obj: object) -> TrainingData | RequestRejected:
    """Validate a decoded data-port reply; raises `InvalidMessage`."""
    return _parse(_reply_adapter, DATA_SERVER_TYPES, obj)


__all__ = [
    "InvalidMessage",
    "RequestRejected",
    "RequestTrainingData",
    "TrainingData",
    "parse_data_reply",
    "parse_data_request",
]
