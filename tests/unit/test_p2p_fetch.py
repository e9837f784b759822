"""Download scheduling without sockets: candidate order, corruption, timeouts, deadline."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from psyche_client.p2p.fetch import FetchError, PeerHealth, fetch_verified, order_candidates
from psyche_client.p2p.transfer import NotHeld, Received
from psyche_common.protocol import ProtocolError

A, B, C, D = (bytes([i]) * 32 for i in range(1, 5))
DATA = b"payload"
DIGEST = hashlib.sha256(DATA).digest()


def good() -> Received:
    return Received(DATA, DIGEST)


def test_order_prefers_fewer_errors_then_known_low_latency() -> None:
    health = PeerHealth()
    health.record_latency(C, 0.2)
    health.record_latency(B, 0.1)
    health.record_error(A)
    assert order_candidates([A, B, C, D, B], health) == [B, C, D, A]
    assert order_candidates([A, B, C, D], health, prefer_fast=False, rotate=1) == [B, C, D, A]
    assert order_candidates([B, C, D], health, prefer_fast=False, rotate=2) == [D, B, C]


def test_health_limits_errors_and_bans_corrupt_peers() -> None:
    health = PeerHealth(max_errors=2)
    health.record_error(A)
    assert health.usable(A)
    health.record_error(A)
    assert not health.usable(A)
    health.record_success(B)
    health.record_corrupt(B)
    assert order_candidates([A, B, C], health) == [C]
    health.record_latency(C, 1.0)
    health.record_latency(C, 0.0)
    assert health.latency[C] == pytest.approx(0.7)


async def test_corrupt_peer_is_reported_and_skipped() -> None:
    calls: list[bytes] = []
    reported: list[bytes] = []

    async def attempt(peer: bytes) -> Received:
        calls.append(peer)
        return Received(b"evil", hashlib.sha256(b"evil").digest()) if peer == A else good()

    data, peer = await fetch_verified(
        attempt,
        DIGEST,
        [A, B],
        what="x",
        health=PeerHealth(),
        deadline=5,
        on_corrupt=lambda p, h: reported.append(p),
    )
    assert (data, peer) == (DATA, B)
    assert calls == [A, B] and reported == [A]


async def test_corrupt_peer_is_not_retried_in_later_rounds() -> None:
    calls: list[bytes] = []

    async def attempt(peer: bytes) -> Received:
        calls.append(peer)
        if peer == A:
            return Received(b"evil", bytes(32))
        raise TimeoutError

    with pytest.raises(FetchError) as info:
        await fetch_verified(
            attempt,
            DIGEST,
            [A, B],
            what="blob q",
            health=PeerHealth(),
            deadline=5,
            rounds=3,
            backoff=0,
        )
    assert calls == [A, B, B, B]
    assert info.value.corrupt_peers == [A]
    assert "blob q" in str(info.value) and "timed out" in str(info.value)


async def test_transient_errors_retry_in_the_next_round() -> None:
    attempts = {A: 0}

    async def attempt(peer: bytes) -> Received:
        attempts[peer] += 1
        if attempts[peer] == 1:
            raise ProtocolError("connection reset")
        return good()

    health = PeerHealth()
    data, _ = await fetch_verified(
        attempt, DIGEST, [A], what="x", health=health, deadline=5, rounds=2, backoff=0
    )
    assert data == DATA and attempts[A] == 2 and A not in health.errors


async def test_not_held_is_not_an_error_against_the_peer() -> None:
    async def attempt(peer: bytes) -> Received:
        raise NotHeld("no such blob")

    health = PeerHealth()
    with pytest.raises(FetchError, match="no such blob"):
        await fetch_verified(attempt, DIGEST, [A], what="x", health=health, deadline=5, rounds=1)
    assert health.errors == {}


async def test_overall_deadline_interrupts_a_hanging_attempt() -> None:
    async def attempt(peer: bytes) -> Received:
        await asyncio.sleep(60)
        return good()

    with pytest.raises(FetchError, match=r"overall deadline of 0\.05s"):
        await fetch_verified(attempt, DIGEST, [A], what="x", health=PeerHealth(), deadline=0.05)


async def test_no_candidates_fails_at_once() -> None:
    async def attempt(peer: bytes) -> Received:
        raise AssertionError("never called")

    with pytest.raises(FetchError, match="no peers"):
        await fetch_verified(attempt, DIGEST, [], what="x", health=PeerHealth(), deadline=5)
