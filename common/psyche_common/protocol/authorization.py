"""Who may join a permissioned run: the authorized-keys list and signed delegations (pure).

A permissioned server (`psyche-server run --authorized-keys FILE`) admits a client whose key
is listed, or one that presents an `Authorization`: a statement signed by a listed
*authorizer* key that names *delegate* keys allowed to join one run until an expiry.

The statement travels as a msgpack map (`encode_authorization`, at most
`MAX_AUTHORIZATION_BYTES`): `version`, `run_id`, `authorizer` (32 bytes), `delegates` (list of
32-byte keys, 1 to `MAX_DELEGATES`), `expires` (unix seconds), `signature` (64 bytes). The
signature is the authorizer's ed25519 signature over `signing_bytes`: the domain
`AUTHORIZATION_DOMAIN` followed by the msgpack array `[version, run_id, authorizer, delegates,
expires]`, so it can be mistaken for no other signed message of the protocol.

`check_admission` decides a Join: None (admitted) or the refusal reason a client is sent.
A key of small order (`identity.check_public_key`: it needs no secret) is refused wherever a
key is read: as a statement's authorizer or delegate, and in an authorized-keys file.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import msgpack

from .framing import BadFrame, DecodeBounds, decode_payload, encode_payload
from .identity import (
    PUBLIC_KEY_SIZE,
    SIGNATURE_SIZE,
    Identity,
    SmallOrderKey,
    check_public_key,
    verify_signature,
)

AUTHORIZATION_VERSION = 1
AUTHORIZATION_DOMAIN = b"psyche-authorization-v1\x00"
MAX_DELEGATES = 64
MAX_AUTHORIZATION_BYTES = 4096
"""The largest encoded statement (64 delegates take about 2.3 KiB)."""
MAX_RUN_ID_LENGTH = 32

_FIELDS = ("version", "run_id", "authorizer", "delegates", "expires", "signature")


class AuthorizationError(ValueError):
    """A malformed statement or authorized-keys file (the message names the field or line)."""


@dataclass(frozen=True)
class Authorization:
    """A signed delegation: `authorizer` lets `delegates` join `run_id` until `expires`."""

    run_id: str
    authorizer: bytes
    delegates: tuple[bytes, ...]
    expires: int
    signature: bytes
    version: int = AUTHORIZATION_VERSION

    def signing_bytes(self) -> bytes:
        return signing_bytes(self.run_id, self.authorizer, self.delegates, self.expires)

    def signature_valid(self) -> bool:
        return verify_signature(self.authorizer, self.signing_bytes(), self.signature)


def signing_bytes(
    run_id: str, authorizer: bytes, delegates: Sequence[bytes], expires: int
) -> bytes:
    """What the authorizer signs (see the module docstring)."""
    body = [AUTHORIZATION_VERSION, run_id, authorizer, list(delegates), expires]
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return AUTHORIZATION_DOMAIN + packed


def sign_authorization(
    authorizer: Identity, run_id: str, delegates: Sequence[bytes], expires: int
) -> Authorization:
    """A statement signed by `authorizer` (the arguments are validated as a parsed one is)."""
    unsigned = Authorization(run_id, authorizer.public_key, tuple(delegates), expires, b"")
    _check_fields(unsigned)
    signature = authorizer.sign(unsigned.signing_bytes())
    return Authorization(run_id, authorizer.public_key, tuple(delegates), expires, signature)


def encode_authorization(authorization: Authorization) -> bytes:
    """The statement's msgpack bytes (what `authorize --out` writes and a Join carries)."""
    return encode_payload(
        {
            "version": authorization.version,
            "run_id": authorization.run_id,
            "authorizer": authorization.authorizer,
            "delegates": list(authorization.delegates),
            "expires": authorization.expires,
            "signature": authorization.signature,
        }
    )


def decode_authorization(data: bytes) -> Authorization:
    """Parse a statement's bytes; raises `AuthorizationError` naming what is wrong (the
    signature is not checked here: `Authorization.signature_valid`)."""
    if len(data) > MAX_AUTHORIZATION_BYTES:
        raise AuthorizationError(
            f"authorization is {len(data)} bytes (at most {MAX_AUTHORIZATION_BYTES})"
        )
    try:
        obj = decode_payload(data, _STATEMENT_BOUNDS)
    except BadFrame as exc:
        raise AuthorizationError(f"authorization is not msgpack: {exc}") from exc
    if not isinstance(obj, dict):
        raise AuthorizationError("authorization must be a msgpack map")
    missing = [name for name in _FIELDS if name not in obj]
    extra = sorted(str(name) for name in obj if name not in _FIELDS)
    if missing or extra:
        raise AuthorizationError(f"authorization fields: missing {missing}, unknown {extra}")
    version, run_id, authorizer = obj["version"], obj["run_id"], obj["authorizer"]
    delegates, expires, signature = obj["delegates"], obj["expires"], obj["signature"]
    if not isinstance(version, int) or version != AUTHORIZATION_VERSION:
        raise AuthorizationError(
            f"authorization.version: {version!r} (this build reads {AUTHORIZATION_VERSION})"
        )
    if not isinstance(run_id, str):
        raise AuthorizationError("authorization.run_id: not a string")
    if not isinstance(delegates, list) or not all(isinstance(d, bytes) for d in delegates):
        raise AuthorizationError("authorization.delegates: not a list of byte strings")
    if not isinstance(authorizer, bytes) or not isinstance(signature, bytes):
        raise AuthorizationError("authorization.authorizer/signature: not byte strings")
    if not isinstance(expires, int) or isinstance(expires, bool):
        raise AuthorizationError("authorization.expires: not an integer")
    authorization = Authorization(run_id, authorizer, tuple(delegates), expires, signature)
    _check_fields(authorization)
    if len(signature) != SIGNATURE_SIZE:
        raise AuthorizationError(
            f"authorization.signature: {len(signature)} bytes (expected {SIGNATURE_SIZE})"
        )
    return authorization


_STATEMENT_BOUNDS = DecodeBounds(max_entries=MAX_DELEGATES, max_depth=2)
"""A statement is a map of six fields, one of them a list of keys: an unauthenticated joiner's
statement is decoded within these bounds."""


def _check_fields(authorization: Authorization) -> None:
    if not 1 <= len(authorization.run_id) <= MAX_RUN_ID_LENGTH:
        raise AuthorizationError(
            f"authorization.run_id: {len(authorization.run_id)} characters "
            f"(1 to {MAX_RUN_ID_LENGTH})"
        )
    if len(authorization.authorizer) != PUBLIC_KEY_SIZE:
        raise AuthorizationError(
            f"authorization.authorizer: {len(authorization.authorizer)} bytes "
            f"(expected {PUBLIC_KEY_SIZE})"
        )
    if not 1 <= len(authorization.delegates) <= MAX_DELEGATES:
        raise AuthorizationError(
            f"authorization.delegates: {len(authorization.delegates)} keys (1 to {MAX_DELEGATES})"
        )
    for index, delegate in enumerate(authorization.delegates):
        if len(delegate) != PUBLIC_KEY_SIZE:
            raise AuthorizationError(
                f"authorization.delegates[{index}]: {len(delegate)} bytes "
                f"(expected {PUBLIC_KEY_SIZE})"
            )
        _refuse_small_order(delegate, f"authorization.delegates[{index}]")
    _refuse_small_order(authorization.authorizer, "authorization.authorizer")
    if not 0 <= authorization.expires < 2**63:
        raise AuthorizationError(f"authorization.expires: {authorization.expires} out of range")


def _refuse_small_order(key: bytes, what: str) -> None:
    try:
        check_public_key(key, what)
    except SmallOrderKey as exc:
        raise AuthorizationError(str(exc)) from None


def parse_public_key(text: str) -> bytes:
    """A public key written as 64 hex characters (`psyche-client show-identity`)."""
    cleaned = text.strip().removeprefix("0x")
    try:
        key = bytes.fromhex(cleaned)
    except ValueError:
        key = b""
    if len(key) != PUBLIC_KEY_SIZE:
        raise AuthorizationError(f"{text.strip()!r} is not a public key (64 hex characters)")
    _refuse_small_order(key, "public key")
    return key


def parse_authorized_keys(text: str, source: str = "authorized keys") -> frozenset[bytes]:
    """The keys of an authorized-keys file: one hex public key per line; `#` starts a
    comment; blank lines are skipped. A bad line raises `AuthorizationError` naming it."""
    keys: set[bytes] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].strip()
        if not content:
            continue
        try:
            keys.add(parse_public_key(content))
        except AuthorizationError as exc:
            raise AuthorizationError(f"{source} line {number}: {exc}") from None
    return frozenset(keys)


def check_admission(
    client: bytes,
    run_id: str,
    authorized: Collection[bytes],
    authorization: bytes | None,
    now: float,
) -> str | None:
    """None when `client` may join `run_id`: its key is in `authorized`, or `authorization`
    (a statement's bytes) is a valid delegation to it; else the reason it is refused."""
    if client in authorized:
        return None
    if authorization is None:
        return (
            f"key {client.hex()} is not authorized to join run {run_id!r} (not in the "
            "server's authorized keys, and no authorization presented)"
        )
    try:
        statement = decode_authorization(authorization)
    except AuthorizationError as exc:
        return f"malformed authorization: {exc}"
    return check_delegation(statement, client, run_id, authorized, now)


def check_delegation(
    statement: Authorization,
    client: bytes,
    run_id: str,
    authorized: Collection[bytes],
    now: float,
) -> str | None:
    """None when `statement` lets `client` join `run_id` at `now`; else why not."""
    if statement.authorizer not in authorized:
        return (
            f"authorization signed by {statement.authorizer.hex()}, which is not in the "
            "server's authorized keys"
        )
    if not statement.signature_valid():
        return "authorization signature does not verify (forged or altered statement)"
    if statement.run_id != run_id:
        return f"authorization is for run {statement.run_id!r}, not {run_id!r}"
    if client not in statement.delegates:
        return f"key {client.hex()} is not among the authorization's delegates"
    if now >= statement.expires:
        expired = datetime.fromtimestamp(statement.expires, UTC).isoformat()
        return f"authorization expired at {expired} ({statement.expires} unix seconds)"
    return None
