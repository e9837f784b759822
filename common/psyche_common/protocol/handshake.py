"""Challenge–response handshake that authenticates a stream's peer by its ed25519 key.

1. The accepting side sends `{"type": "Challenge", "challenge": <32 random bytes>}`.
2. The connecting side replies `{"type": "ChallengeResponse", "public_key": <32 bytes>,
   "signature": <64 bytes>}`, signing `CHALLENGE_DOMAIN + challenge`.
3. The accepting side verifies; the public key becomes the peer's identity.

The domain prefix keeps a handshake signature from ever being valid for any other signed
message of the project (commitments, etc.). Used by the coordinator, data server and P2P ports.
"""

from __future__ import annotations

import asyncio
import secrets

from .framing import DEFAULT_MAX_FRAME_SIZE, ProtocolError, read_frame, write_frame
from .identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity, verify_signature

CHALLENGE_SIZE = 32
CHALLENGE_DOMAIN = b"psyche-py/handshake/v1\x00"
DEFAULT_HANDSHAKE_TIMEOUT = 10.0


class HandshakeError(ProtocolError):
    """The peer failed the challenge–response handshake (the reason says how)."""


def new_challenge() -> bytes:
    return secrets.token_bytes(CHALLENGE_SIZE)


def challenge_message(challenge: bytes) -> dict[str, object]:
    return {"type": "Challenge", "challenge": challenge}


def sign_challenge(identity: Identity, challenge: bytes) -> dict[str, object]:
    """The ChallengeResponse message for `challenge`."""
    return {
        "type": "ChallengeResponse",
        "public_key": identity.public_key,
        "signature": identity.sign(CHALLENGE_DOMAIN + challenge),
    }


def verify_challenge_response(challenge: bytes, message: object) -> bytes:
    """Check a decoded ChallengeResponse against `challenge`; returns the peer's public key."""
    if not isinstance(message, dict) or message.get("type") != "ChallengeResponse":
        kind = message.get("type") if isinstance(message, dict) else type(message).__name__
        raise HandshakeError(f"expected a ChallengeResponse, got {kind!r}")
    public_key = message.get("public_key")
    signature = message.get("signature")
    if not isinstance(public_key, bytes) or len(public_key) != PUBLIC_KEY_SIZE:
        raise HandshakeError(f"ChallengeResponse.public_key must be {PUBLIC_KEY_SIZE} bytes")
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_SIZE:
        raise HandshakeError(f"ChallengeResponse.signature must be {SIGNATURE_SIZE} bytes")
    extra = set(message) - {"type", "public_key", "signature"}
    if extra:
        raise HandshakeError(f"ChallengeResponse has unknown fields {sorted(extra)}")
    if not verify_signature(public_key, CHALLENGE_DOMAIN + challenge, signature):
        raise HandshakeError("ChallengeResponse signature does not verify")
    return public_key


async def accept_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> bytes:
    """Server side: send a challenge, verify the reply; returns the peer's public key.

    Raises `HandshakeError` / other `ProtocolError`s, or `TimeoutError` after `timeout` s."""
    challenge = new_challenge()
    async with asyncio.timeout(timeout):
        await write_frame(writer, challenge_message(challenge))
        reply = await read_frame(reader, max_frame_size)
    return verify_challenge_response(challenge, reply)


async def connect_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    identity: Identity,
    *,
    timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> None:
    """Client side: wait for the challenge and answer it with `identity`."""
    async with asyncio.timeout(timeout):
        message = await read_frame(reader, max_frame_size)
        if not isinstance(message, dict) or message.get("type") != "Challenge":
            if isinstance(message, dict) and message.get("type") == "Rejected":
                raise HandshakeError(f"server rejected the connection: {message.get('reason')}")
            raise HandshakeError("expected a Challenge as the first frame")
        challenge = message.get("challenge")
        if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_SIZE:
            raise HandshakeError(f"Challenge.challenge must be {CHALLENGE_SIZE} bytes")
        await write_frame(writer, sign_challenge(identity, challenge))
