"""Encrypted, authenticated frames after a handshake: one module for every link of the project.

The coordinator, data-server and relay ports (`handshake`) and the client↔client P2P links
(`psyche_client.p2p.connection`) all end their handshake the same way: each side made an
ephemeral X25519 key for this connection alone (`EphemeralKey`) and sent its public half in a
handshake message that the other side's signature covers. `derive_channel` then turns the
X25519 shared secret into two AES-256-GCM keys with HKDF-SHA256, salted with a hash of the
whole handshake transcript (the service domain, which names the run, both challenges, both
identity keys and both ephemeral keys), one key per direction. A `SecureChannel` wraps the
stream afterwards:

- a frame is a 4-byte big-endian length, then the AES-GCM ciphertext of one msgpack payload
  with its 16-byte tag; the length prefix is the associated data;
- the nonce is the frame's number in its direction (a 96-bit counter, never sent), so no
  nonce repeats under a key, and a frame replayed, reordered, dropped or altered fails
  authentication (`FrameAuthenticationError`, naming the peer): the link is then closed.

Nothing of a frame but its length is readable on the wire. The keys exist only in memory and
only for one connection (forward secrecy: a leaked identity key does not decrypt past links).
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .framing import (
    CONTROL_DECODE,
    CONTROL_FRAME_SIZE,
    DEFAULT_MAX_FRAME_SIZE,
    ConnectionClosed,
    DecodeBounds,
    FrameTooLarge,
    ProtocolError,
    decode_payload,
    encode_payload,
)

EPHEMERAL_KEY_SIZE = 32
TAG_SIZE = 16
"""Bytes the AEAD adds to every payload."""
KEY_SIZE = 32
SEAL_INTO_MIN = 32 * 1024
"""Payloads from this size on are sealed into a buffer made for the frame (see
`SecureChannel.seal_payload`); below it, a separate ciphertext joined to the prefix is cheaper
(`encrypt_into` costs about 1 µs more per call than `encrypt`, measured with `cryptography`
50 on the development VM)."""
_LENGTH = struct.Struct(">I")
_KDF_INFO = b"psyche-py/secure-channel/v1"
_MAX_COUNTER = (1 << 64) - 1


class FrameAuthenticationError(ProtocolError):
    """A frame failed authentication: altered, replayed, reordered or not from the peer."""


class ExchangeError(ProtocolError):
    """The peer's ephemeral key is malformed or gives no shared secret."""


class EphemeralKey:
    """A fresh X25519 key pair for one handshake (never stored, never reused)."""

    def __init__(self) -> None:
        self._private = X25519PrivateKey.generate()
        self.public: bytes = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def exchange(self, peer_public: object) -> bytes:
        """The shared secret with the peer's ephemeral public key; raises `ExchangeError` on a
        malformed key or a low-order one (an all-zero secret)."""
        if not isinstance(peer_public, bytes) or len(peer_public) != EPHEMERAL_KEY_SIZE:
            raise ExchangeError(f"an ephemeral key must be {EPHEMERAL_KEY_SIZE} bytes")
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError as exc:  # OpenSSL refuses a low-order point (all-zero secret)
            raise ExchangeError(f"the peer's ephemeral key is unusable: {exc}") from exc
        if shared == bytes(len(shared)):
            raise ExchangeError("the peer's ephemeral key gives an all-zero secret")
        return shared


def transcript_hash(*parts: bytes) -> bytes:
    """SHA-256 over length-prefixed `parts` (so no two different transcripts collide by
    shifting bytes from one part to the next)."""
    digest = hashlib.sha256(b"psyche-py/transcript/v1")
    for part in parts:
        digest.update(_LENGTH.pack(len(part)))
        digest.update(part)
    return digest.digest()


@dataclass(frozen=True)
class ChannelKeys:
    """The two directions' keys of one link, as seen from one side."""

    send: bytes
    receive: bytes


def derive_keys(shared_secret: bytes, transcript: bytes, *, initiator: bool) -> ChannelKeys:
    """Both directions' keys from the X25519 secret and the handshake transcript's hash.

    `initiator`: this side opened the connection (a client of a server port, a P2P dialer);
    the two sides get each other's keys the other way round."""
    material = HKDF(
        algorithm=hashes.SHA256(), length=2 * KEY_SIZE, salt=transcript, info=_KDF_INFO
    ).derive(shared_secret)
    to_responder, to_initiator = material[:KEY_SIZE], material[KEY_SIZE:]
    if initiator:
        return ChannelKeys(send=to_responder, receive=to_initiator)
    return ChannelKeys(send=to_initiator, receive=to_responder)


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "big")


class SecureChannel:
    """Encrypted, authenticated frames over one stream (see the module docstring).

    Writes are sealed and handed to the transport synchronously, so frames go out in the
    order of their nonces even when several tasks write; reads must come from one task."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        keys: ChannelKeys,
        *,
        peer: str,
        peer_key: bytes | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.peer = peer
        """Who is at the other end, for error messages (a short id, or an address)."""
        self.peer_key = peer_key
        """The other end's identity key, once the handshake proved it."""
        self._sealer = AESGCM(keys.send)
        self._opener = AESGCM(keys.receive)
        self._sent = 0
        self._received = 0

    # ---- writing -----------------------------------------------------------------------------

    def seal_payload(self, payload: bytes, max_size: int | None = None) -> bytes | bytearray:
        """One whole frame (length prefix + ciphertext) of an encoded payload; the next nonce
        is used up. Raises `FrameTooLarge` when the payload is over `max_size`.

        A payload of `SEAL_INTO_MIN` bytes or more is encrypted straight into the frame's
        buffer after its prefix (one copy of a bulk frame, not a ciphertext and then a joined
        frame); a smaller one is encrypted, then joined to its prefix, which costs less than
        preparing a buffer for it. The frame is the same either way."""
        if max_size is not None and len(payload) > max_size:
            raise FrameTooLarge(len(payload), max_size)
        size = len(payload) + TAG_SIZE
        if size > 0xFFFFFFFF:
            raise FrameTooLarge(len(payload), 0xFFFFFFFF - TAG_SIZE)
        if self._sent > _MAX_COUNTER:
            raise ProtocolError(f"the link to {self.peer} sent 2^64 frames: reconnect")
        header = _LENGTH.pack(size)
        nonce = _nonce(self._sent)
        self._sent += 1
        if len(payload) < SEAL_INTO_MIN:
            return header + self._sealer.encrypt(nonce, payload, header)
        frame = bytearray(_LENGTH.size + size)
        frame[: _LENGTH.size] = header
        with memoryview(frame) as view:
            self._sealer.encrypt_into(nonce, payload, header, view[_LENGTH.size :])
        return frame

    def seal(self, obj: Any, max_size: int | None = None) -> bytes | bytearray:
        """`seal_payload` of the msgpack encoding of `obj`."""
        return self.seal_payload(encode_payload(obj), max_size)

    def write(self, obj: Any, max_size: int | None = None) -> int:
        """Seal `obj` and queue it on the transport (no wait); returns the bytes queued."""
        frame = self.seal(obj, max_size)
        self.writer.write(frame)
        return len(frame)

    def write_payload(self, payload: bytes) -> int:
        """Seal an already encoded payload (one encoding broadcast to many links) and queue
        it; returns the bytes queued."""
        frame = self.seal_payload(payload)
        self.writer.write(frame)
        return len(frame)

    async def send(self, obj: Any, max_size: int | None = None) -> int:
        """`write`, then wait for the transport buffer to drain."""
        size = self.write(obj, max_size)
        await self.writer.drain()
        return size

    # ---- reading -----------------------------------------------------------------------------

    def open_frame(self, header: bytes, body: bytes) -> bytes:
        """The payload of one received frame; raises `FrameAuthenticationError`."""
        if len(body) < TAG_SIZE:
            raise FrameAuthenticationError(
                f"frame {self._received} from {self.peer} is shorter than its tag"
            )
        try:
            payload = self._opener.decrypt(_nonce(self._received), body, header)
        except InvalidTag as exc:
            raise FrameAuthenticationError(
                f"frame {self._received} from {self.peer} failed authentication "
                "(altered, replayed or reordered in transit)"
            ) from exc
        self._received += 1
        return payload

    async def read_header(self, timeout: float | None = None) -> bytes | None:
        """The next frame's length prefix (None: the stream ended cleanly between frames)."""
        async with asyncio.timeout(timeout):
            try:
                return await self.reader.readexactly(_LENGTH.size)
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    return None
                raise ConnectionClosed(
                    f"{self.peer} closed the connection in the middle of a length prefix"
                ) from exc

    async def read_body(
        self, header: bytes, max_size: int = DEFAULT_MAX_FRAME_SIZE, timeout: float | None = None
    ) -> bytes:
        """The payload of the frame announced by `header` (its size checked first)."""
        (size,) = _LENGTH.unpack(header)
        if size > max_size + TAG_SIZE:
            raise FrameTooLarge(size - TAG_SIZE, max_size)
        async with asyncio.timeout(timeout):
            try:
                body = await self.reader.readexactly(size)
            except asyncio.IncompleteReadError as exc:
                raise ConnectionClosed(
                    f"{self.peer} closed the connection after {len(exc.partial)} of {size} "
                    "frame bytes"
                ) from exc
        return self.open_frame(header, body)

    async def read_payload(
        self, max_size: int = DEFAULT_MAX_FRAME_SIZE, timeout: float | None = None
    ) -> bytes:
        """One authenticated payload of at most `max_size` bytes. Raises `ConnectionClosed`,
        `FrameTooLarge`, `FrameAuthenticationError`, or `TimeoutError` after `timeout` s."""
        async with asyncio.timeout(timeout):
            header = await self.read_header()
            if header is None:
                raise ConnectionClosed(f"{self.peer} closed the connection")
            return await self.read_body(header, max_size)

    async def read(
        self,
        max_size: int = DEFAULT_MAX_FRAME_SIZE,
        timeout: float | None = None,
        bounds: DecodeBounds | None = None,
    ) -> Any:
        """`read_payload`, decoded within `bounds` when given (`BadFrame` when it is not one
        msgpack value, or one past the bounds)."""
        return decode_payload(await self.read_payload(max_size, timeout), bounds)

    async def read_control(
        self, timeout: float | None = None, max_size: int = CONTROL_FRAME_SIZE
    ) -> Any:
        """One control frame on the encrypted link (`framing.read_control_frame`'s limits:
        at most `max_size` ≤ `CONTROL_FRAME_SIZE` bytes, decoded within `CONTROL_DECODE`), for
        a peer that is authenticated but not yet trusted with more (before a Join, relay and
        data requests)."""
        return await self.read(min(max_size, CONTROL_FRAME_SIZE), timeout, CONTROL_DECODE)

    # ---- the stream ----------------------------------------------------------------------------

    def abort(self) -> None:
        """Drop the connection at once."""
        self.writer.transport.abort()

    def close(self) -> None:
        self.writer.close()
