"""Challenge–response handshakes that authenticate a stream's peers by their ed25519 keys and
agree on the keys of the encrypted link that follows (`secure_channel`).

Every signature made in a handshake is bound to its service (and run): the signed bytes start
with a *domain* — `coordinator_domain(run_id)`, `data_server_domain(run_id)`,
`relay_domain(run_id)` or `P2P_DOMAIN` — so a signature made for one service or run never
verifies for another, and none is ever valid for any other signed message of the project
(commitments, announcements).

Server handshake (the coordinator, data-server and relay ports; the server's identity is its
ed25519 key, printed at start):

1. The accepting side sends `{"type": "Challenge", "challenge": <32 random bytes>,
   "server_key": <its 32-byte identity key>, "ephemeral": <its 32-byte X25519 key>}`.
2. The connecting side checks `server_key` against the one it expects (`--server-key`) when
   it expects one, and replies `{"type": "ChallengeResponse", "public_key": <32 bytes>,
   "ephemeral": <32 bytes>, "signature": <64 bytes>}`, signing
   `domain + b"client" + server_transcript(...)`: a hash of the challenge, both identity keys
   and both ephemeral keys.
3. The accepting side refuses a `public_key` of small order (`identity.check_public_key`:
   such a key needs no secret) and verifies with its own domain; the public key becomes the peer's identity.
   A port shared by several services (the coordinator port also serves the relay) verifies
   against each of their domains (`accept_handshake_in`): the domain that verifies says which
   service the peer asked for. A failure is answered with a plain `Rejected{reason}`.
4. Both sides derive the link's keys (`secure_channel.derive_keys`, salted with the domain and
   the transcript); the accepting side's first encrypted frame is `Welcome{signature}`, its
   identity key's signature of `domain + b"server" + transcript`. The connecting side checks
   it, so the server proved its key over this very exchange before the client sends anything
   else. Every later frame, both ways, is encrypted and authenticated.

Mutual handshake (P2P; `mutual_transcript`): both sides sign a transcript naming the role,
both challenges, both identity keys and both ephemeral keys, and the listener signs first, so
a dialer never signs anything before the listener proved its key, and a signature relayed to
any other listener is useless (the wire steps are in `psyche_client.p2p.connection`). The
server's reachability probe asks a listener to prove its key only (`probe_transcript`; no
link keys, the probe closes right after).

Every handshake frame (both ways, and a refusal) is a control frame: at most
`HANDSHAKE_FRAME_SIZE` bytes, decoded within `framing.CONTROL_DECODE`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from psyche_common.client_id import short_id

from .framing import (
    CONTROL_DECODE,
    BadFrame,
    ProtocolError,
    decode_payload,
    read_frame,
    write_frame,
)
from .identity import (
    PUBLIC_KEY_SIZE,
    SIGNATURE_SIZE,
    Identity,
    SmallOrderKey,
    check_public_key,
    verify_signature,
)
from .secure_channel import (
    EPHEMERAL_KEY_SIZE,
    EphemeralKey,
    FrameAuthenticationError,
    SecureChannel,
    derive_keys,
    transcript_hash,
)

CHALLENGE_SIZE = 32
COORDINATOR_SERVICE = b"psyche-py/coordinator/v5"  # v5: encrypted links, the server's key
DATA_SERVER_SERVICE = b"psyche-py/data-server/v4"
RELAY_SERVICE = b"psyche-py/relay/v2"
P2P_DOMAIN = b"psyche-py/p2p/v4\x00"  # v4: ephemeral keys, encrypted links
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
HANDSHAKE_FRAME_SIZE = 4096
"""The largest handshake frame either side reads (a Challenge is about 150 bytes, a
ChallengeResponse about 200, a Welcome about 110): checked on the length prefix, before
anything is read or decoded, and decoded within `framing.CONTROL_DECODE`, so an
unauthenticated peer cannot make the other side buffer or decode more than this."""
_CLIENT = b"client"
_SERVER = b"server"


class HandshakeError(ProtocolError):
    """The peer failed the challenge–response handshake (the reason says how)."""


class HandshakeRefused(HandshakeError):
    """The server answered the handshake with `Rejected`; `reason` is its text."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"server rejected the connection: {reason}")
        self.reason = reason


class ServerKeyMismatch(HandshakeError):
    """The server's identity key is not the one the client was told to expect."""


def _run_domain(service: bytes, run_id: str) -> bytes:
    encoded = run_id.encode("utf-8")
    return service + b"\x00" + len(encoded).to_bytes(4, "big") + encoded + b"\x00"


def coordinator_domain(run_id: str) -> bytes:
    """The handshake domain of the coordinator port of run `run_id`."""
    return _run_domain(COORDINATOR_SERVICE, run_id)


def data_server_domain(run_id: str) -> bytes:
    """The handshake domain of the data-server port of run `run_id`."""
    return _run_domain(DATA_SERVER_SERVICE, run_id)


def relay_domain(run_id: str) -> bytes:
    """The handshake domain of the relay port of run `run_id`."""
    return _run_domain(RELAY_SERVICE, run_id)


def new_challenge() -> bytes:
    return secrets.token_bytes(CHALLENGE_SIZE)


@dataclass(frozen=True)
class ServerHello:
    """What a server port's `Challenge` carries."""

    challenge: bytes
    server_key: bytes
    ephemeral: bytes

    def to_wire(self) -> dict[str, object]:
        return {
            "type": "Challenge",
            "challenge": self.challenge,
            "server_key": self.server_key,
            "ephemeral": self.ephemeral,
        }


def server_transcript(hello: ServerHello, client_key: bytes, client_ephemeral: bytes) -> bytes:
    """The hash both sides of a server handshake sign (after their domain and role)."""
    return transcript_hash(
        hello.challenge, hello.server_key, hello.ephemeral, client_key, client_ephemeral
    )


def sign_challenge(
    identity: Identity, hello: ServerHello, domain: bytes, ephemeral: EphemeralKey
) -> dict[str, object]:
    """The ChallengeResponse message to `hello` in handshake domain `domain`."""
    transcript = server_transcript(hello, identity.public_key, ephemeral.public)
    return {
        "type": "ChallengeResponse",
        "public_key": identity.public_key,
        "ephemeral": ephemeral.public,
        "signature": identity.sign(domain + _CLIENT + transcript),
    }


def _fields(message: object, kind: str, names: Sequence[str]) -> dict[str, object]:
    if not isinstance(message, dict) or message.get("type") != kind:
        got = message.get("type") if isinstance(message, dict) else type(message).__name__
        raise HandshakeError(f"expected a {kind}, got {got!r}")
    extra = set(message) - {"type", *names}
    if extra:
        raise HandshakeError(f"{kind} has unknown fields {sorted(extra)}")
    return message


def _sized(message: dict[str, object], kind: str, name: str, size: int) -> bytes:
    value = message.get(name)
    if not isinstance(value, bytes) or len(value) != size:
        raise HandshakeError(f"{kind}.{name} must be {size} bytes")
    return value


def identity_key(message: dict[str, object], kind: str, name: str) -> bytes:
    """The identity key in field `name` of a `kind` message: 32 bytes and not of small order
    (`identity.check_public_key`; such a key needs no secret), else `HandshakeError`."""
    key = _sized(message, kind, name, PUBLIC_KEY_SIZE)
    try:
        return check_public_key(key, f"{kind}.{name}")
    except SmallOrderKey as exc:
        raise HandshakeError(str(exc)) from exc


def signed_key(message: object, kind: str) -> tuple[bytes, bytes]:
    """`(public_key, signature)` of a decoded `kind` message with exactly those fields."""
    fields = _fields(message, kind, ("public_key", "signature"))
    return (
        identity_key(fields, kind, "public_key"),
        _sized(fields, kind, "signature", SIGNATURE_SIZE),
    )


@dataclass(frozen=True)
class ChallengeResponse:
    public_key: bytes
    ephemeral: bytes
    signature: bytes


def read_response(message: object) -> ChallengeResponse:
    """The fields of a decoded ChallengeResponse (shapes checked, nothing verified)."""
    kind = "ChallengeResponse"
    fields = _fields(message, kind, ("public_key", "ephemeral", "signature"))
    return ChallengeResponse(
        identity_key(fields, kind, "public_key"),
        _sized(fields, kind, "ephemeral", EPHEMERAL_KEY_SIZE),
        _sized(fields, kind, "signature", SIGNATURE_SIZE),
    )


def verify_challenge_response_in(
    hello: ServerHello, message: object, domains: Sequence[bytes]
) -> tuple[ChallengeResponse, bytes]:
    """Check a decoded ChallengeResponse to `hello` in any of `domains`; returns the response
    and the domain its signature verifies in."""
    response = read_response(message)
    transcript = server_transcript(hello, response.public_key, response.ephemeral)
    for domain in domains:
        if verify_signature(response.public_key, domain + _CLIENT + transcript, response.signature):
            return response, domain
    # An honest client signs correctly for the domain it was started with: a signature that
    # verifies in none of ours comes from a client of another run id or protocol version.
    raise HandshakeError(
        "ChallengeResponse signature does not verify for this service and run (a client "
        "started with another run id, or of another protocol version)"
    )


def mutual_transcript(
    role: str,
    listener_challenge: bytes,
    dialer_challenge: bytes,
    listener_key: bytes,
    dialer_key: bytes,
    listener_ephemeral: bytes,
    dialer_ephemeral: bytes,
) -> bytes:
    """What the `role` ("listener" | "dialer") side of a P2P handshake signs."""
    if role not in ("listener", "dialer"):
        raise ValueError(f"role must be 'listener' or 'dialer', got {role!r}")
    return (
        P2P_DOMAIN
        + role.encode("ascii")
        + b"\x00"
        + p2p_transcript(
            listener_challenge,
            dialer_challenge,
            listener_key,
            dialer_key,
            listener_ephemeral,
            dialer_ephemeral,
        )
    )


def p2p_transcript(
    listener_challenge: bytes,
    dialer_challenge: bytes,
    listener_key: bytes,
    dialer_key: bytes,
    listener_ephemeral: bytes,
    dialer_ephemeral: bytes,
) -> bytes:
    """The hash of a P2P handshake (what both roles sign, and the link keys' salt)."""
    return transcript_hash(
        P2P_DOMAIN,
        listener_challenge,
        dialer_challenge,
        listener_key,
        dialer_key,
        listener_ephemeral,
        dialer_ephemeral,
    )


def probe_transcript(
    listener_challenge: bytes, prober_challenge: bytes, listener_key: bytes
) -> bytes:
    """What a P2P listener signs for the server's reachability probe (a `Probe` instead of a
    `Hello`): it proves the listener's key at the probed address, and it names no dialer, so
    it is no use in any handshake."""
    return P2P_DOMAIN + b"probe\x00" + listener_challenge + prober_challenge + listener_key


def read_challenge(message: object) -> bytes:
    """The nonce of a decoded Challenge message (a `Rejected` names the server's reason)."""
    if not isinstance(message, dict) or message.get("type") != "Challenge":
        if isinstance(message, dict) and message.get("type") == "Rejected":
            raise HandshakeRefused(str(message.get("reason")))
        raise HandshakeError("expected a Challenge as the first frame")
    return _sized(message, "Challenge", "challenge", CHALLENGE_SIZE)


def read_server_hello(message: object) -> ServerHello:
    """The fields of a server port's Challenge."""
    challenge = read_challenge(message)
    assert isinstance(message, dict)
    _fields(message, "Challenge", ("challenge", "server_key", "ephemeral"))
    return ServerHello(
        challenge,
        identity_key(message, "Challenge", "server_key"),
        _sized(message, "Challenge", "ephemeral", EPHEMERAL_KEY_SIZE),
    )


def _channel_salt(domain: bytes, transcript: bytes) -> bytes:
    return transcript_hash(domain, transcript)


@dataclass(frozen=True)
class Accepted:
    """A client that passed a server port's handshake."""

    peer_key: bytes
    domain: bytes
    """The domain its signature verified in (which service it asked for)."""
    channel: SecureChannel


async def accept_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    identity: Identity,
    *,
    domain: bytes,
    timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    max_frame_size: int = HANDSHAKE_FRAME_SIZE,
) -> Accepted:
    """Server side: challenge, verify the reply in `domain`, open the encrypted link.

    Raises `HandshakeError` / other `ProtocolError`s, or `TimeoutError` after `timeout` s."""
    return await accept_handshake_in(
        reader, writer, identity, domains=(domain,), timeout=timeout, max_frame_size=max_frame_size
    )


async def accept_handshake_in(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    identity: Identity,
    *,
    domains: Sequence[bytes],
    timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    max_frame_size: int = HANDSHAKE_FRAME_SIZE,
) -> Accepted:
    """`accept_handshake` on a port shared by several services (the peer's signature says
    which one it asked for: `Accepted.domain`)."""
    ephemeral = EphemeralKey()
    hello = ServerHello(new_challenge(), identity.public_key, ephemeral.public)
    async with asyncio.timeout(timeout):
        await write_frame(writer, hello.to_wire())
        reply = await read_frame(reader, max_frame_size, bounds=CONTROL_DECODE)
        response, domain = verify_challenge_response_in(hello, reply, domains)
        transcript = server_transcript(hello, response.public_key, response.ephemeral)
        keys = derive_keys(
            ephemeral.exchange(response.ephemeral),
            _channel_salt(domain, transcript),
            initiator=False,
        )
        channel = SecureChannel(
            reader, writer, keys, peer=short_id(response.public_key), peer_key=response.public_key
        )
        welcome = {"type": "Welcome", "signature": identity.sign(domain + _SERVER + transcript)}
        await channel.send(welcome)
    return Accepted(response.public_key, domain, channel)


async def connect_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    identity: Identity,
    *,
    domain: bytes,
    timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    max_frame_size: int = HANDSHAKE_FRAME_SIZE,
    server_key: bytes | None = None,
) -> SecureChannel:
    """Client side: answer the challenge with `identity` in `domain`, check the server's
    `Welcome`, and return the encrypted link. With `server_key`, a server with another key
    is refused (`ServerKeyMismatch`) before anything is signed for it."""
    async with asyncio.timeout(timeout):
        hello = read_server_hello(await read_frame(reader, max_frame_size, bounds=CONTROL_DECODE))
        if server_key is not None and hello.server_key != server_key:
            raise ServerKeyMismatch(
                f"the server's key is {hello.server_key.hex()}, not the expected "
                f"{server_key.hex()} (--server-key): refusing to talk to it"
            )
        ephemeral = EphemeralKey()
        await write_frame(writer, sign_challenge(identity, hello, domain, ephemeral))
        transcript = server_transcript(hello, identity.public_key, ephemeral.public)
        keys = derive_keys(
            ephemeral.exchange(hello.ephemeral), _channel_salt(domain, transcript), initiator=True
        )
        channel = SecureChannel(reader, writer, keys, peer=f"server {short_id(hello.server_key)}")
        welcome = await _read_welcome(channel, max_frame_size)
        signature = _sized(welcome, "Welcome", "signature", SIGNATURE_SIZE)
        if not verify_signature(hello.server_key, domain + _SERVER + transcript, signature):
            raise HandshakeError("the server's Welcome signature does not verify")
    channel.peer_key = hello.server_key
    return channel


async def _read_welcome(channel: SecureChannel, max_frame_size: int) -> dict[str, object]:
    """The server's first encrypted frame, a `Welcome`; a refusal of the handshake comes in
    the clear (the server had no link keys for us) and becomes a `HandshakeError`."""
    header = await channel.read_header()
    if header is None:
        raise HandshakeError("the server closed the connection during the handshake")
    size = int.from_bytes(header, "big")
    if size > max_frame_size:
        raise HandshakeError(f"the server's answer to the handshake is {size} bytes")
    body = await channel.reader.readexactly(size)
    try:
        payload = channel.open_frame(header, body)
    except FrameAuthenticationError:
        try:
            plain = decode_payload(body, CONTROL_DECODE)
        except BadFrame:
            plain = None
        if isinstance(plain, dict) and plain.get("type") == "Rejected":
            raise HandshakeRefused(str(plain.get("reason"))) from None
        raise
    return _fields(decode_payload(payload, CONTROL_DECODE), "Welcome", ("signature",))
