"""Staying with the run when the coordinator server goes away: reconnecting with backoff.

A lost server connection (a crash, a restart, a network cut) does not end the client: it keeps
its model, its P2P node and its round pipeline while `ServerSession` connects again with the
same identity (every new `ServerLink` sends `Join`). Before the n-th attempt it waits
`Backoff.delay(n)`: 0.5 s doubling up to 10 s, each ±20 % at random so that the clients of a
run do not all knock at once. It gives up, and `updates()` raises `ServerLinkError`, once
`give_up_after` seconds have passed since the connection was lost (0: at once, no attempt).
An outage ends when the new connection delivers a state. A `Rejected` answer is final (a
wrong run id), and so is a server whose key is not `--server-key`, except "already connected": the server still holds our previous connection and
will drop it, so that one is retried. `status` is what the dashboard shows.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from psyche_common.retry import call, retry_on, retrying
from tenacity import RetryCallState

from psyche_client.session.server_link import (
    CONNECT_TIMEOUT,
    ServerLink,
    ServerLinkError,
    ServerRejected,
    ServerUpdate,
    WrongServerKey,
)
from psyche_client.session.uplink import SwitchableUplink

log = logging.getLogger("psyche.client.server")

MIN_CONNECT_TIMEOUT = 1.0
"""An attempt close to the give-up time still gets this long to connect."""


@dataclass(frozen=True)
class Backoff:
    """Capped exponential delays with jitter (pure)."""

    initial: float = 0.5
    factor: float = 2.0
    cap: float = 10.0
    jitter: float = 0.2

    def base(self, attempt: int) -> float:
        """The delay before attempt `attempt` (1, 2, ...) without jitter."""
        if attempt < 1:
            raise ValueError(f"attempt {attempt} is not 1 or more")
        return min(self.cap, self.initial * self.factor ** min(attempt - 1, 64))

    def delay(self, attempt: int, unit: float) -> float:
        """The delay before attempt `attempt`; `unit` in [0, 1) draws the jitter (0.5: none)."""
        return self.base(attempt) * (1.0 + self.jitter * (2.0 * unit - 1.0))


@dataclass
class SessionStatus:
    """Where the session is: connected, or reconnecting since `lost_at` (monotonic seconds)."""

    connected: bool = False
    attempt: int = 0
    lost_at: float | None = None
    next_attempt_at: float | None = None
    last_error: str = ""

    def describe(self, now: float) -> str:
        if self.connected:
            return "connected"
        if self.lost_at is None:
            return "not connected"
        wait = (
            ""
            if self.next_attempt_at is None
            else f", next in {max(0.0, self.next_attempt_at - now):.0f} s"
        )
        return f"reconnecting (attempt {self.attempt}{wait})"


Connector = Callable[[float], Awaitable[ServerLink]]
"""Opens a new `ServerLink` (handshake + Join) within the given timeout."""


class ServerSession:
    """The client's server connection across reconnections; feeds `uplink`."""

    def __init__(
        self,
        connect: Connector,
        give_up_after: float,
        backoff: Backoff | None = None,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        uplink: SwitchableUplink | None = None,
    ) -> None:
        self._connect = connect
        self.give_up_after = give_up_after
        self.backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._clock = clock
        self.uplink = uplink if uplink is not None else SwitchableUplink()
        self.status = SessionStatus()
        self.reconnects = 0

    async def open(self) -> None:
        """The first connection, not retried: a wrong address fails at once."""
        self._attach(await self._connect(CONNECT_TIMEOUT))

    async def aclose(self) -> None:
        link = self.uplink.detach()
        self.status.connected = False
        if link is not None:
            await link.close()

    async def updates(self) -> AsyncIterator[ServerUpdate]:
        """Every new coordinator state, across reconnections; raises `ServerLinkError` when
        the server rejected us for good or could not be reached again in time."""
        while True:
            link = self.uplink.link
            if link is None:
                raise RuntimeError("ServerSession.updates() before open()")
            try:
                async for update in link.states():
                    self.status.lost_at = None
                    self.status.attempt = 0
                    yield update
            except ServerRejected as exc:
                if not exc.retryable:
                    raise
                error: ServerLinkError = exc
            except ServerLinkError as exc:
                error = exc
            await self.aclose()
            await self._reconnect(error)

    def _attach(self, link: ServerLink) -> None:
        self.uplink.attach(link)
        self.status.connected = True
        self.status.next_attempt_at = None

    async def _reconnect(self, error: ServerLinkError) -> None:
        status = self.status
        status.last_error = str(error)
        if status.lost_at is None:
            status.lost_at = self._clock()
            log.warning("%s", error, extra={"error": str(error)})
        deadline = status.lost_at + self.give_up_after
        first = True

        async def connect() -> ServerLink:
            """The lost connection is the failure the retrying starts from; then connect."""
            nonlocal first
            if first:
                first = False
                raise error
            timeout = max(MIN_CONNECT_TIMEOUT, min(CONNECT_TIMEOUT, deadline - self._clock()))
            try:
                return await self._connect(timeout)
            except ServerLinkError as exc:
                status.last_error = str(exc)
                raise

        def next_delay(state: RetryCallState) -> float:
            remaining = deadline - self._clock()
            return min(self.backoff.delay(status.attempt + 1, self._rng.random()), remaining)

        def before_attempt(state: RetryCallState) -> None:
            status.attempt += 1
            delay = state.upcoming_sleep
            status.next_attempt_at = self._clock() + delay
            log.warning(
                "server connection lost: reconnecting (attempt %d, next in %.1f s)",
                status.attempt,
                delay,
                extra={"attempt": status.attempt, "delay_s": round(delay, 3)},
            )

        def give_up(state: RetryCallState) -> ServerLink:
            raise self._gave_up(error)

        reconnecting = retrying(
            wait=next_delay,
            retry=retry_on(
                lambda exc: isinstance(exc, ServerLinkError) and not isinstance(exc, WrongServerKey)
            ),  # another server at the address (WrongServerKey) is final, like a rejection
            stop=lambda state: deadline - self._clock() <= 0,
            before_sleep=before_attempt,
            on_give_up=give_up,
        )
        link = await call(reconnecting, connect)
        self._attach(link)
        self.reconnects += 1
        log.info(
            "reconnected to the server",
            extra={
                "attempt": status.attempt,
                "downtime_s": round(self._clock() - status.lost_at, 3),
            },
        )

    def _gave_up(self, error: ServerLinkError) -> ServerLinkError:
        status = self.status
        if status.attempt == 0:  # give_up_after == 0: the loss itself is the error, as before
            return error
        return ServerLinkError(
            f"{error}; gave up reconnecting after {self.give_up_after:g} s "
            f"({status.attempt} attempts, last error: {status.last_error})"
        )
