"""Challenge–response handshakes that authenticate a stream's peer by its ed25519 key.

Every signature made in a handshake is bound to its service (and run): the signed bytes start
with a *domain* — `coordinator_domain(run_id)`, `data_server_domain(run_id)`,
`relay_domain(run_id)` or `P2P_DOMAIN` — so a signature made for one service or run never
verifies for another, and none is ever valid for any other signed message of the project
(commitments, announcements).

One-way handshake (the coordinator, data-server and relay ports; the server has no key):

1. The accepting side sends `{"type": "Challenge", "challenge": <32 random bytes>}`.
2. The connecting side replies `{"type": "ChallengeResponse", "public_key": <32 bytes>,
   "signature": <64 bytes>}`, signing `domain + challenge`.
3. The accepting side verifies with its own domain; the public key becomes the peer's identity.
   A port shared by several services (the coordinator port also serves the relay) verifies
   against each of their domains (`accept_handshake_in`): the domain that verifies says which
   service the peer asked for.

Mutual handshake (P2P; `mutual_transcript`): both sides sign a transcript naming the role,
both challenges and both keys, and the listener signs first, so a dialer never signs anything
before the listener proved its key, and a signature relayed to any other listener is useless
(the wire steps are in `psyche_client.p2p.connection`). The server's reachability probe asks a
listener to prove its key only (`probe_transcript`).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence

from .framing import CONTROL_DECODE, ProtocolError, read_frame, write_frame
from .identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity, verify_signature

CHALLENGE_SIZE = 32
COORDINATOR_SERVICE = b"psyche-py/coordinator/v4"  # v4: Reachability.relay_port
DATA_SERVER_SERVICE = b"psyche-py/data-server/v3"
RELAY_SERVICE = b"psyche-py/relay/v1"
P2P_DOMAIN = b"psyche-py/p2p/v3\x00"  # v3: streams in both directions on every link
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
HANDSHAKE_FRAME_SIZE = 4096
"""The largest handshake frame either side reads (a ChallengeResponse is about 150 bytes):
checked on the length prefix, before anything is read or decoded, and decoded within
`framing.CONTROL_DECODE`, so an unauthenticated peer cannot make the other side buffer or
decode more than this."""


class HandshakeError(ProtocolError):
    """The peer failed the challenge–response handshake (the reason says how)."""


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


def challenge_message(challenge: bytes) -> dict[str, object]:
    return {"type": "Challenge", "challenge": challenge}


def sign_challenge(identity: Identity, challenge: bytes, domain: bytes) -> dict[str, object]:
    """The ChallengeResponse message for `challenge` in handshake domain `domain`."""
    return {
        "type": "ChallengeResponse",
        "public_key": identity.public_key,
        "signature": identity.sign(domain + challenge),
    }


def signed_key(message: object, kind: str) -> tuple[bytes, bytes]:
    """`(public_key, signature)` of a decoded `kind` message with exactly those fields."""
    if not isinstance(message, dict) or message.get("type") != kind:
        got = message.get("type") if isinstance(message, dict) else type(message).__name__
        raise HandshakeError(f"expected a {kind}, got {got!r}")
    public_key = message.get("public_key")
    signature = message.get("signature")
    if not isinstance(public_key, bytes) or len(public_key) != PUBLIC_KEY_SIZE:
        raise HandshakeError(f"{kind}.public_key must be {PUBLIC_KEY_SIZE} bytes")
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_SIZE:
        raise HandshakeError(f"{kind}.signature must be {SIGNATURE_SIZE} bytes")
    extra = set(message) - {"type", "public_key", "signature"}
    if extra:
        raise HandshakeError(f"{kind} has unknown fields {sorted(extra)}")
    return public_key, signature


def verify_challenge_response(challenge: bytes, message: object, domain: bytes) -> bytes:
    """Check a decoded ChallengeResponse against `challenge` in `domain`; returns the key."""
    return verify_challenge_response_in(challenge, message, (domain,))[0]


def verify_challenge_response_in(
    challenge: bytes, message: object, domains: Sequence[bytes]
) -> tuple[bytes, bytes]:
    """Check a decoded ChallengeResponse against `challenge` in any of `domains`; returns
    `(public_key, the domain its signature verifies in)`."""
    public_key, signature = signed_key(message, "ChallengeResponse")
    for domain in domains:
        if verify_signature(public_key, domain + challenge, signature):
            return public_key, domain
    raise HandshakeError("ChallengeResponse signature does not verify for this service")


def mutual_transcript(
    role: str,
    listener_challenge: bytes,
    dialer_challenge: bytes,
    listener_key: bytes,
    dialer_key: bytes,
) -> bytes:
    """What the `role` ("listener" | "dialer") side of a P2P handshake signs."""
    if role not in ("listener", "dialer"):
        raise ValueError(f"role must be 'listener' or 'dialer', got {role!r}")
    return (
        P2P_DOMAIN
        + role.encode("ascii")
        + b"\x00"
        + listener_challenge
        + dialer_challenge
        + listener_key
        + dialer_key
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
            raise HandshakeError(f"server rejected the connection: {message.get('reason')}")
        raise HandshakeError("expected a Challenge as the first frame")
    challenge = message.get("challenge")
    if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_SIZE:
        raise HandshakeError(f"Challenge.challenge must be {CHALLENGE_SIZE} bytes")
    return challenge


async def accept_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    domain: bytes,
    timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    max_frame_size: int = HANDSHAKE_FRAME_SIZE,
) -> bytes:
    """Server side: send a challenge, verify the reply in `domain`; returns the peer's key.

    Raises `HandshakeError` / other `ProtocolError`s, or `TimeoutError` after `timeout` s."""
    key, _ = await accept_handshake_in(
        reader, writer, domains=(domain,), timeout=timeout, max_frame_size=max_frame_size
    )
    return key


async def accept_handshake_in(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    domains: Sequence[bytes],
    timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    max_frame_size: int = HANDSHAKE_FRAME_SIZE,
) -> tuple[bytes, bytes]:
    """`accept_handshake` on a port shared by several services: returns `(peer key, the
    domain the peer signed in)`."""
    challenge = new_challenge()
    async with asyncio.timeout(timeout):
        await write_frame(writer, challenge_message(challenge))
        reply = await read_frame(reader, max_frame_size, bounds=CONTROL_DECODE)
    return verify_challenge_response_in(challenge, reply, domains)


async def connect_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    identity: Identity,
    *,
    domain: bytes,
    timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    max_frame_size: int = HANDSHAKE_FRAME_SIZE,
) -> None:
    """Client side: wait for the challenge and answer it with `identity` in `domain`."""
    async with asyncio.timeout(timeout):
        challenge = read_challenge(await read_frame(reader, max_frame_size, bounds=CONTROL_DECODE))
        await write_frame(writer, sign_challenge(identity, challenge, domain))
