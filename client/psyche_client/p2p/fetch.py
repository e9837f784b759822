"""Downloading hash-checked bytes from whichever candidate peer can serve them.

`fetch_verified` tries candidates one after another (best first, see `order_candidates`),
each attempt bounded by the caller's per-chunk read timeout, the whole fetch bounded by an
overall deadline, and makes up to `rounds` passes over the candidates with a short backoff
(doubling, through `psyche_common.retry`).
Bytes whose SHA-256 differs from the expected hash are never returned: the serving peer is
reported through `on_corrupt`, skipped for the rest of this fetch, and the next peer is tried.
A fetch therefore always ends: with verified bytes or a `FetchError` listing every attempt.

The transport is injected (`attempt(peer_id) -> Received`), so this module is pure scheduling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from psyche_common.protocol import ProtocolError, short_id
from psyche_common.retry import call, doubling, retry_on, retrying

from .transfer import NotHeld, Received


@dataclass(frozen=True)
class FetchFailure:
    """One failed attempt: which peer, why, and whether it served corrupted bytes."""

    peer_id: bytes
    reason: str
    corrupt: bool = False


class FetchError(Exception):
    """No candidate delivered verified bytes; `failures` lists every attempt."""

    def __init__(self, what: str, failures: Sequence[FetchFailure], why: str = "") -> None:
        detail = "; ".join(f"{short_id(f.peer_id)}: {f.reason}" for f in failures) or "no peers"
        super().__init__(f"could not fetch {what}{': ' + why if why else ''} ({detail})")
        self.what = what
        self.failures = list(failures)

    @property
    def corrupt_peers(self) -> list[bytes]:
        return [f.peer_id for f in self.failures if f.corrupt]


@dataclass
class PeerHealth:
    """What we learned about peers: latency (EWMA seconds), consecutive errors, corruption.

    With `max_errors` set, a peer with that many consecutive errors is no longer usable
    (the reference drops a model-sharing peer after 5 errors); a peer that served corrupted
    bytes is never usable again within this record (`record_corrupt`; `fetch_verified` itself
    only bans such a peer for the rest of the fetch and reports it through `on_corrupt`).
    """

    max_errors: int | None = None
    latency: dict[bytes, float] = field(default_factory=dict)
    errors: dict[bytes, int] = field(default_factory=dict)
    corrupt: set[bytes] = field(default_factory=set)

    def record_latency(self, peer_id: bytes, seconds: float) -> None:
        previous = self.latency.get(peer_id)
        self.latency[peer_id] = seconds if previous is None else 0.7 * previous + 0.3 * seconds

    def record_success(self, peer_id: bytes) -> None:
        self.errors.pop(peer_id, None)

    def record_error(self, peer_id: bytes) -> None:
        self.errors[peer_id] = self.errors.get(peer_id, 0) + 1

    def record_corrupt(self, peer_id: bytes) -> None:
        self.corrupt.add(peer_id)

    def usable(self, peer_id: bytes) -> bool:
        if peer_id in self.corrupt:
            return False
        return self.max_errors is None or self.errors.get(peer_id, 0) < self.max_errors

    def rank(self, peer_id: bytes, prefer_fast: bool) -> tuple[int, int, float]:
        """Sort key: fewer errors first, then measured latency (unknown last)."""
        errors = self.errors.get(peer_id, 0)
        latency = self.latency.get(peer_id)
        if not prefer_fast:
            return (errors, 0, 0.0)
        return (errors, 1, 0.0) if latency is None else (errors, 0, latency)


def order_candidates(
    candidates: Sequence[bytes],
    health: PeerHealth,
    *,
    rotate: int = 0,
    prefer_fast: bool = True,
) -> list[bytes]:
    """Unique usable candidates, best first. `rotate` shifts the starting point among equals
    (used to spread parameter requests over peers); the sort is stable."""
    unique = [p for p in dict.fromkeys(candidates) if health.usable(p)]
    if unique:
        shift = rotate % len(unique)
        unique = unique[shift:] + unique[:shift]
    return sorted(unique, key=lambda p: health.rank(p, prefer_fast))


TRANSIENT_ERRORS = (OSError, ProtocolError, TimeoutError, asyncio.IncompleteReadError)


async def fetch_verified(
    attempt: Callable[[bytes], Awaitable[Received]],
    expected_sha256: bytes,
    candidates: Sequence[bytes],
    *,
    what: str,
    health: PeerHealth,
    deadline: float,
    rounds: int = 2,
    backoff: float = 0.2,
    rotate: int = 0,
    prefer_fast: bool = True,
    on_corrupt: Callable[[bytes, bytes], None] | None = None,
) -> tuple[bytes, bytes]:
    """Verified bytes and the id of the peer that served them; raises `FetchError`."""
    failures: list[FetchFailure] = []
    banned: set[bytes] = set()
    started = time.monotonic()

    def ordered() -> list[bytes]:
        ranked = order_candidates(candidates, health, rotate=rotate, prefer_fast=prefer_fast)
        return [p for p in ranked if p not in banned]

    order = ordered()

    async def one_round() -> tuple[bytes, bytes]:
        """Every candidate once, in order; the next round's order is made before its wait."""
        nonlocal order
        for peer_id in order:
            result = await _try_once(attempt, peer_id, expected_sha256, health, failures)
            if result is not None:
                return result, peer_id
            if failures and failures[-1].corrupt:
                banned.add(peer_id)
                if on_corrupt is not None:
                    on_corrupt(peer_id, expected_sha256)
        order = ordered()
        raise _RoundFailed

    fetching = retrying(
        wait=doubling(backoff),
        retry=retry_on(lambda exc: isinstance(exc, _RoundFailed) and bool(order)),
        attempts=rounds,
    )
    try:
        async with asyncio.timeout(deadline):
            if order and rounds > 0:
                return await call(fetching, one_round)
    except TimeoutError:
        elapsed = time.monotonic() - started
        raise FetchError(
            what, failures, f"overall deadline of {deadline}s passed after {elapsed:.1f}s"
        ) from None
    except _RoundFailed:
        pass
    raise FetchError(what, failures, f"every candidate failed ({rounds} round(s))")


class _RoundFailed(Exception):
    """No candidate of a round served the bytes."""


async def _try_once(
    attempt: Callable[[bytes], Awaitable[Received]],
    peer_id: bytes,
    expected_sha256: bytes,
    health: PeerHealth,
    failures: list[FetchFailure],
) -> bytes | None:
    try:
        received = await attempt(peer_id)
    except NotHeld as exc:
        failures.append(FetchFailure(peer_id, str(exc)))
        return None
    except TimeoutError as exc:
        health.record_error(peer_id)
        failures.append(FetchFailure(peer_id, str(exc) or "timed out waiting for data"))
        return None
    except TRANSIENT_ERRORS as exc:
        health.record_error(peer_id)
        failures.append(FetchFailure(peer_id, f"{type(exc).__name__}: {exc}"))
        return None
    if received.sha256 != expected_sha256:
        health.record_error(peer_id)
        failures.append(
            FetchFailure(
                peer_id,
                f"served corrupted bytes (sha256 {received.sha256.hex()[:16]}…, "
                f"expected {expected_sha256.hex()[:16]}…)",
                corrupt=True,
            )
        )
        return None
    health.record_success(peer_id)
    return received.data
