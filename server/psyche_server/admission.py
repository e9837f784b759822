"""Who may join a permissioned run (`--authorized-keys FILE`): the file, its reloads, the
admission of each Join and which admitted clients a reload revoked.

`AuthorizedKeysFile` reads the file at start-up (a bad line is an error naming it) and again
when its modification time or size changed and then stayed the same for one whole poll
interval (`reload_if_changed`, polled from the tick loop every `POLL_INTERVAL` seconds;
`file_watch.SettleWatch`: a file written in pieces is never read half-written) or at once on
demand (`reload`, SIGHUP). A changed file that does not load fails closed for newcomers: the
previous list stays for the clients already admitted (none is revoked), `error` names the file
and the fault (one warning per change), and `Admission` refuses every new Join naming them
until a valid file loads (logged). So a key removed in a file that does not load stays
admitted only while it stays connected; it cannot rejoin, and neither can anyone else.
`Admission` decides each Join with `psyche_common.protocol.authorization.check_admission`
and remembers what admitted each client, so that after a reload `revoked` names the connected
clients whose key (or whose authorizer's key) is no longer listed. An authorization's expiry
is checked at Join only.

One listed key must not mint an army. `Admission` therefore admits at most
`max_delegates` delegates per authorizer at a time, counted across all its statements over
the clients admitted and still connected (pending or members; `--max-delegates-per-authorizer`),
refuses a statement that expires more than `max_lifetime` seconds ahead
(`--max-authorization-days`), orders the pending set listed keys first (`seat_order`: when the
member slots are short, delegates wait), and names each client's *voter* (`voter`: the
authorizer for a delegate, the key itself otherwise) so majorities count one vote per listed
key with its delegates (`consistency`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from psyche_common.protocol import short_id
from psyche_common.protocol.authorization import (
    Authorization,
    AuthorizationError,
    check_admission,
    decode_authorization,
    parse_authorized_keys,
)

from .file_watch import UNREADABLE, SettleWatch, Signature

log = logging.getLogger("psyche.server.admission")

POLL_INTERVAL = 2.0
"""Seconds between two looks at the authorized-keys file's modification time."""
MAX_DELEGATES_PER_AUTHORIZER = 4
"""Default of `--max-delegates-per-authorizer`."""
MAX_AUTHORIZATION_DAYS = 30.0
"""Default of `--max-authorization-days`."""
DAY = 86_400.0


class AuthorizedKeysFile:
    """The keys listed in one file, re-read when it changed and settled."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self.keys: frozenset[bytes] = frozenset()
        self.error: str | None = None
        """Why the file on disk, changed since `keys` loaded, does not load (None: it did).
        While set, `Admission` admits no new client."""
        self.public_error = ""
        """`error` as a refused client reads it (`refusal`): no server path."""
        self._watch = SettleWatch()
        self._last_poll = -float("inf")
        self.reloads = 0

    def load(self) -> None:
        """Read the file; raises `AuthorizationError` (naming the line) or `OSError`."""
        signature = self._stat()
        self.keys = parse_authorized_keys(self.path.read_text(), str(self.path))
        self._watch.was_read(signature)
        self.error = None

    def _stat(self) -> Signature:
        stat = os.stat(self.path)
        return stat.st_mtime_ns, stat.st_size

    def _signature(self) -> Signature:
        try:
            return self._stat()
        except OSError:
            return UNREADABLE

    def reload_if_changed(self) -> bool:
        """At most every `POLL_INTERVAL` s: reload when the file's mtime or size changed and
        the previous poll saw it the same (so a file being written is not read); True when
        the list was replaced."""
        now = self._clock()
        if now - self._last_poll < POLL_INTERVAL:
            return False
        self._last_poll = now
        if not self._watch.poll(self._signature()):
            return False
        return self.reload()

    def reload(self) -> bool:
        """Re-read the file now. True when the list was replaced; on an error the list stays,
        `error` says why (a warning) and new Joins are refused until a valid file loads."""
        signature = self._signature()
        try:
            keys = parse_authorized_keys(self.path.read_text(), str(self.path))
        except (AuthorizationError, OSError, UnicodeDecodeError) as exc:
            self._watch.was_read(signature)  # warn once per change, not at every poll
            self._fail(str(exc), self._public(exc))
            return False
        if self._signature() != signature:  # written to while read: wait until it settles
            log.info("%s changed while it was read; reading it again once it settles", self.path)
            self._watch.seen = None
            return False
        self._watch.was_read(signature)
        if self.error is not None:
            log.info(
                "authorized keys from %s load again: new Joins are admitted again",
                self.path,
                extra={"path": str(self.path)},
            )
            self.error = None
        added, removed = len(keys - self.keys), len(self.keys - keys)
        self.keys = keys
        self.reloads += 1
        log.info(
            "authorized keys reloaded from %s: %d keys (%d added, %d removed)",
            self.path,
            len(keys),
            added,
            removed,
            extra={"keys": len(keys), "added": added, "removed": removed},
        )
        return True

    def _public(self, exc: Exception) -> str:
        """What a refused client may read of `exc`: the fault, not where the server keeps its
        files (an OSError's own text, a parse error with the file's bare name)."""
        if isinstance(exc, OSError):
            return exc.strerror or type(exc).__name__
        return str(exc).replace(str(self.path), self.path.name)

    def _fail(self, error: str, public: str) -> None:
        self.error = error
        self.public_error = public
        log.warning(
            "cannot reload the authorized keys from %s: %s; keeping the previous %d keys for "
            "the clients admitted so far and refusing every new Join until the file loads",
            self.path,
            error,
            len(self.keys),
            extra={"path": str(self.path), "error": error},
        )

    def refusal(self) -> str | None:
        """The Rejected reason for a new Join while the file does not load; None when it
        does."""
        if self.error is None:
            return None
        return (
            f"the server's authorized-keys file {self.path.name} does not load "
            f"({self.public_error}); "
            "no new client is admitted until it is fixed"
        )


class Admission:
    """Decides Joins against an `AuthorizedKeysFile` and remembers who was admitted how."""

    def __init__(
        self,
        keys: AuthorizedKeysFile,
        clock: Callable[[], float] = time.time,
        *,
        max_delegates: int = MAX_DELEGATES_PER_AUTHORIZER,
        max_lifetime: float = MAX_AUTHORIZATION_DAYS * DAY,
    ) -> None:
        self.keys = keys
        self._clock = clock
        self.max_delegates = max_delegates
        self.max_lifetime = max_lifetime
        self._granted: dict[bytes, Authorization | None] = {}
        """Admitted clients: None when listed themselves, else the statement that admitted
        them."""
        self.refused = 0

    def admit(self, client: bytes, run_id: str, authorization: bytes | None) -> str | None:
        """None (and remembered) when `client` may join; else the refusal reason."""
        now = self._clock()
        broken = None if client in self._granted else self.keys.refusal()
        if broken is not None:
            self.refused += 1
            return broken
        reason = check_admission(client, run_id, self.keys.keys, authorization, now)
        listed = client in self.keys.keys
        statement = (
            None
            if reason is not None or listed or authorization is None
            else decode_authorization(authorization)
        )
        if statement is not None:
            reason = self._check_limits(client, statement, now)
        if reason is not None:
            self.refused += 1
            return reason
        self._granted[client] = statement
        if statement is not None:
            log.info(
                "%s admitted by delegation from %s",
                short_id(client),
                short_id(statement.authorizer),
            )
        return None

    def _check_limits(self, client: bytes, statement: Authorization, now: float) -> str | None:
        """Why a valid delegation is refused all the same (too long-lived, or its authorizer
        has `max_delegates` delegates admitted already); None when it is not."""
        if statement.expires > now + self.max_lifetime:
            return (
                f"authorization expires {(statement.expires - now) / DAY:.1f} days from now, "
                f"later than this server accepts ({self.max_lifetime / DAY:g} days, "
                "--max-authorization-days)"
            )
        delegates = self.delegates_of(statement.authorizer) - {client}
        if len(delegates) >= self.max_delegates:
            return (
                f"authorizer {short_id(statement.authorizer)} already has {len(delegates)} "
                f"delegates admitted (at most {self.max_delegates}, "
                "--max-delegates-per-authorizer)"
            )
        return None

    def delegates_of(self, authorizer: bytes) -> set[bytes]:
        """The admitted (and still connected) clients that `authorizer`'s statements let in."""
        return {
            client
            for client, statement in self._granted.items()
            if statement is not None and statement.authorizer == authorizer
        }

    def voter(self, client: bytes) -> bytes:
        """Whose vote `client` casts: its authorizer's when a delegation admitted it, else
        its own."""
        statement = self._granted.get(client)
        return client if statement is None else statement.authorizer

    def authorizers(self, members: Iterable[bytes]) -> dict[bytes, bytes]:
        """Member → authorizer, for the `members` a delegation admitted (what the state
        broadcast tells the clients, so their majorities count one vote per listed key)."""
        found = {}
        for client in members:
            statement = self._granted.get(client)
            if statement is not None:
                found[client] = statement.authorizer
        return found

    def seat_order(self, pending: Iterable[bytes]) -> list[bytes]:
        """`pending` (in join order) with the listed keys before the delegates, so that
        delegates take only the member slots the listed keys leave."""
        ordered = list(pending)
        return sorted(ordered, key=lambda client: self._granted.get(client) is not None)

    def forget(self, client: bytes) -> None:
        self._granted.pop(client, None)

    def revoked(self, clients: Iterable[bytes]) -> list[bytes]:
        """Of `clients` (admitted earlier), those the current list no longer admits: their
        key was removed, or the authorizer of the statement that admitted them was."""
        keys = self.keys.keys
        gone = []
        for client in clients:
            if client not in self._granted:
                continue
            statement = self._granted[client]
            if client in keys:
                continue
            if statement is None or statement.authorizer not in keys:
                gone.append(client)
        return gone
