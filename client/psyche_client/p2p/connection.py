"""Authenticated, encrypted peer connections: mutual ed25519 handshake, counted frames.

Handshake on a new P2P stream (`P2P_DOMAIN`; each side signs
`psyche_common.protocol.handshake.mutual_transcript(role, listener_challenge,
dialer_challenge, listener_key, dialer_key, listener_ephemeral, dialer_ephemeral)`):

1. listener → `Challenge{challenge, ephemeral}` (its nonce and a fresh X25519 key).
2. dialer → `Hello{challenge, public_key, ephemeral}` (its own nonce, the key it claims and
   its fresh X25519 key).
3. A claimed key of small order (`handshake.identity_key`) fails the handshake (so does such a
   key in either `Proof`); a malformed `Hello` (such a key included) is answered with
   `Rejected{reason}` before the stream closes. The listener asks its `is_member(claimed
   key)` callback; a non-member gets `Rejected{reason}` and the stream is closed. Otherwise
   listener → `Proof{public_key, signature}` over the "listener" transcript.
4. The dialer checks that the listener's key is the peer id it meant to reach (addresses come
   from the coordinator broadcast) and its signature, and only then signs: dialer →
   `Proof{public_key, signature}` over the "dialer" transcript.
5. The listener checks the key is the one claimed in `Hello` and the signature.

The dialer signs nothing before the listener proved its key, and what it signs names both keys,
both nonces and both ephemeral keys, so no signature of a handshake can be relayed to log in
anywhere else (another peer, the coordinator or the data server, whose domains differ anyway).

6. Both sides derive the link's keys from the X25519 secret, salted with the transcript
   (`psyche_common.protocol.secure_channel`): every later frame, both ways, is encrypted and
   authenticated; one that fails authentication ends the link (`FrameAuthenticationError`,
   naming the peer).

Instead of a `Hello`, the server's reachability probe sends `Probe{challenge}`: the listener
answers `Proof{public_key, signature}` over `handshake.probe_transcript` (its key at this
address, nothing else) and closes the stream (`ProbeAnswered`); no link keys are made.

Every handshake frame, either side, is a control frame: at most `HANDSHAKE_FRAME_SIZE` bytes,
checked on the length prefix, and decoded within `CONTROL_DECODE`; only an authenticated,
encrypted link's frames may reach `max_frame_size`, and they are decoded within
`frames.LINK_DECODE` and must be known link frames (`frames.check_link_frame`).

Every frame written or read through a `PeerConnection` is counted in `TransferStats`. After
the handshake a connection becomes a `link.PeerLink` carrying streams in both directions.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psyche_common.protocol import (
    CONTROL_DECODE,
    HANDSHAKE_FRAME_SIZE,
    BadFrame,
    ConnectionClosed,
    FrameTooLarge,
    HandshakeError,
    Identity,
    ProtocolError,
    SecureChannel,
    decode_payload,
    encode_frame,
    read_frame_bytes,
    short_id,
    verify_signature,
)
from psyche_common.protocol.handshake import (
    CHALLENGE_SIZE,
    identity_key,
    mutual_transcript,
    new_challenge,
    p2p_transcript,
    probe_transcript,
    read_challenge,
    signed_key,
)
from psyche_common.protocol.secure_channel import (
    EPHEMERAL_KEY_SIZE,
    TAG_SIZE,
    EphemeralKey,
    derive_keys,
)

from .frames import LINK_DECODE, check_link_frame
from .stats import TransferStats

LENGTH_PREFIX_SIZE = 4


class PeerRefused(ProtocolError):
    """The remote node refused to serve us (e.g. we are not a member of its epoch)."""


class ProbeAnswered(Exception):
    """The stream was the server's reachability probe: it got its proof and ends here."""


class PeerUnavailable(ProtocolError):
    """No usable address is known for a peer, or it cannot be reached."""


@dataclass(eq=False)
class PeerConnection:
    """One authenticated stream to `peer_id`; used by one request at a time. Frames are in
    the clear during the handshake only; `encrypt` switches it to its `SecureChannel`."""

    peer_id: bytes
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    stats: TransferStats
    max_frame_size: int
    write_timeout: float | None = None
    """Longest wait for a write to drain (a peer that stops reading cannot hold us)."""
    last_used: float = field(default_factory=time.monotonic)
    channel: SecureChannel | None = None
    """The encrypted link, from the end of the handshake on."""

    def encrypt(self, channel: SecureChannel) -> None:
        self.channel = channel

    async def send(self, message: dict[str, Any]) -> None:
        frame: bytes | bytearray
        if self.channel is not None:
            frame = self.channel.seal(message, self.max_frame_size)
        else:
            frame = encode_frame(message, self.max_frame_size)
        self.writer.write(frame)
        async with asyncio.timeout(self.write_timeout):
            await self.writer.drain()
        self.stats.record_sent(self.peer_id or None, len(frame))

    async def receive(self, timeout: float | None) -> dict[str, Any]:
        """Next frame as a map with a string `type`; `TimeoutError` after `timeout` s."""
        if self.channel is not None:
            return self._decode(await self.channel.read_payload(self.max_frame_size, timeout))
        payload = await read_frame_bytes(self.reader, self.max_frame_size, timeout)
        return self._decode(payload)

    async def receive_handshake(self) -> dict[str, Any]:
        """The next handshake frame: a control frame (see the module docstring)."""
        payload = await read_frame_bytes(self.reader, HANDSHAKE_FRAME_SIZE)
        return self._decode(payload, control=True)

    async def receive_next(self, idle: float, timeout: float) -> dict[str, Any] | None:
        """The next frame, or None when none starts within `idle` s (nothing is consumed
        then, so the stream stays aligned); a started frame must arrive within `timeout` s."""
        if self.channel is not None:
            try:
                header = await self.channel.read_header(idle)
            except TimeoutError:
                return None
            if header is None:
                raise ConnectionClosed("peer closed the connection")
            return self._decode(await self.channel.read_body(header, self.max_frame_size, timeout))
        try:
            async with asyncio.timeout(idle):
                header = await self.reader.readexactly(LENGTH_PREFIX_SIZE)
        except TimeoutError:
            return None
        except asyncio.IncompleteReadError as exc:
            raise ConnectionClosed("peer closed the connection") from exc
        size = int.from_bytes(header, "big")
        if size > self.max_frame_size:
            raise FrameTooLarge(size, self.max_frame_size)
        try:
            async with asyncio.timeout(timeout):
                payload = await self.reader.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionClosed(
                f"peer closed the connection after {len(exc.partial)} of {size} payload bytes"
            ) from exc
        return self._decode(payload)

    def _decode(self, payload: bytes, control: bool = False) -> dict[str, Any]:
        overhead = LENGTH_PREFIX_SIZE + (TAG_SIZE if self.channel is not None else 0)
        self.stats.record_received(self.peer_id or None, len(payload) + overhead)
        message = decode_payload(payload, CONTROL_DECODE if control else LINK_DECODE)
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise BadFrame("P2P frame must be a map with a string 'type'")
        if not control:
            check_link_frame(message)
        return message

    @property
    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.writer.wait_closed()


async def accept_peer(
    conn: PeerConnection,
    identity: Identity,
    is_member: Callable[[bytes], bool],
    timeout: float,
) -> bytes:
    """Listener side of the mutual handshake; returns the authenticated dialer id. Raises
    `ProbeAnswered` after answering the server's reachability probe."""
    async with asyncio.timeout(timeout):
        challenge = new_challenge()
        ephemeral = EphemeralKey()
        await conn.send(
            {"type": "Challenge", "challenge": challenge, "ephemeral": ephemeral.public}
        )
        first = await conn.receive_handshake()
        if first.get("type") == "Probe":
            prober = read_probe(first)
            signed = probe_transcript(challenge, prober, identity.public_key)
            await conn.send(proof_message(identity, signed))
            raise ProbeAnswered()
        try:
            theirs, claimed, their_ephemeral = read_hello(first)
        except HandshakeError as exc:  # e.g. a key of small order: the dialer learns why
            await conn.send({"type": "Rejected", "reason": str(exc)})
            raise
        conn.peer_id = claimed
        if not is_member(claimed):
            reason = f"peer {short_id(claimed)} is not a member of the current epoch"
            await conn.send({"type": "Rejected", "reason": reason})
            raise PeerRefused(reason)
        parts = (
            challenge,
            theirs,
            identity.public_key,
            claimed,
            ephemeral.public,
            their_ephemeral,
        )
        await conn.send(proof_message(identity, mutual_transcript("listener", *parts)))
        dialer_id, signature = signed_key(await conn.receive_handshake(), "Proof")
        if dialer_id != claimed:
            raise HandshakeError(
                f"the dialer claimed {short_id(claimed)} but proved {short_id(dialer_id)}"
            )
        if not verify_signature(dialer_id, mutual_transcript("dialer", *parts), signature):
            raise HandshakeError(f"the Proof of {short_id(dialer_id)} does not verify")
        keys = derive_keys(
            ephemeral.exchange(their_ephemeral), p2p_transcript(*parts), initiator=False
        )
        conn.encrypt(
            SecureChannel(
                conn.reader,
                conn.writer,
                keys,
                peer=f"peer {short_id(dialer_id)}",
                peer_key=dialer_id,
            )
        )
    return dialer_id


async def dial_peer(
    peer_id: bytes,
    host: str,
    port: int,
    identity: Identity,
    stats: TransferStats,
    *,
    connect_timeout: float,
    handshake_timeout: float,
    max_frame_size: int,
) -> PeerConnection:
    """Open and authenticate a stream to `peer_id` at host:port (raises on any failure)."""
    where = f"{short_id(peer_id)} at {host}:{port}"
    try:
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(host, port)
    except TimeoutError as exc:
        raise PeerUnavailable(f"connecting to {where} timed out after {connect_timeout}s") from exc
    except OSError as exc:
        raise PeerUnavailable(f"cannot connect to {where}: {exc}") from exc
    return await dial_over(
        peer_id,
        reader,
        writer,
        identity,
        stats,
        where=where,
        handshake_timeout=handshake_timeout,
        max_frame_size=max_frame_size,
    )


async def dial_over(
    peer_id: bytes,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    identity: Identity,
    stats: TransferStats,
    *,
    where: str,
    handshake_timeout: float,
    max_frame_size: int,
) -> PeerConnection:
    """The dialer side of the handshake on an open stream (a socket to the peer's listener,
    or a relay pipe); `where` names the peer in errors. Closes the stream on any failure."""
    conn = PeerConnection(peer_id, reader, writer, stats, max_frame_size, handshake_timeout)
    try:
        async with asyncio.timeout(handshake_timeout):
            first = await conn.receive_handshake()
            raise_if_rejected(first, where)
            try:
                theirs = read_challenge(first)
            except HandshakeError as exc:
                raise HandshakeError(f"{where} did not open with a Challenge: {exc}") from exc
            their_ephemeral = _ephemeral_of(first, "Challenge")
            mine = new_challenge()
            ephemeral = EphemeralKey()
            await conn.send(
                {
                    "type": "Hello",
                    "challenge": mine,
                    "public_key": identity.public_key,
                    "ephemeral": ephemeral.public,
                }
            )
            reply = await conn.receive_handshake()
            raise_if_rejected(reply, where)
            actual, signature = signed_key(reply, "Proof")
            if actual != peer_id:
                raise HandshakeError(f"the node reached is {short_id(actual)}, not {where}")
            parts = (theirs, mine, actual, identity.public_key, their_ephemeral, ephemeral.public)
            if not verify_signature(actual, mutual_transcript("listener", *parts), signature):
                raise HandshakeError(f"the Proof of {where} does not verify")
            await conn.send(proof_message(identity, mutual_transcript("dialer", *parts)))
            keys = derive_keys(
                ephemeral.exchange(their_ephemeral), p2p_transcript(*parts), initiator=True
            )
            conn.encrypt(
                SecureChannel(
                    conn.reader, conn.writer, keys, peer=f"peer {short_id(actual)}", peer_key=actual
                )
            )
    except BaseException:
        await conn.close()
        raise
    return conn


def read_hello(message: dict[str, Any]) -> tuple[bytes, bytes, bytes]:
    """`(dialer challenge, claimed dialer key, dialer ephemeral key)` of a `Hello` frame."""
    if message.get("type") != "Hello":
        raise HandshakeError(f"expected the dialer's Hello, got {message.get('type')!r}")
    challenge = message.get("challenge")
    if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_SIZE:
        raise HandshakeError(f"Hello.challenge must be {CHALLENGE_SIZE} bytes")
    if set(message) - {"type", "challenge", "public_key", "ephemeral"}:
        raise HandshakeError("Hello has unknown fields")
    return challenge, identity_key(message, "Hello", "public_key"), _ephemeral_of(message, "Hello")


def _ephemeral_of(message: dict[str, Any], kind: str) -> bytes:
    ephemeral = message.get("ephemeral")
    if not isinstance(ephemeral, bytes) or len(ephemeral) != EPHEMERAL_KEY_SIZE:
        raise HandshakeError(f"{kind}.ephemeral must be {EPHEMERAL_KEY_SIZE} bytes")
    return ephemeral


def read_probe(message: dict[str, Any]) -> bytes:
    """The prober's challenge of a `Probe` frame."""
    challenge = message.get("challenge")
    if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_SIZE:
        raise HandshakeError(f"Probe.challenge must be {CHALLENGE_SIZE} bytes")
    if set(message) - {"type", "challenge"}:
        raise HandshakeError("Probe has unknown fields")
    return challenge


def proof_message(identity: Identity, transcript: bytes) -> dict[str, Any]:
    return {
        "type": "Proof",
        "public_key": identity.public_key,
        "signature": identity.sign(transcript),
    }


def raise_if_rejected(message: dict[str, Any], where: str) -> None:
    """Raise `PeerRefused` with the peer's reason when `message` is a `Rejected` frame."""
    if message.get("type") == "Rejected":
        raise PeerRefused(f"{where} refused the connection: {message.get('reason')}")


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (IPv6 hosts in brackets) → (host, port); raises ValueError naming it."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"P2P address {address!r} is not host:port")
    return host.strip("[]"), int(port_text)


def advertised_host(bind_host: str) -> str:
    """What peers should dial for a listener bound to `bind_host` (wildcards → primary IP)."""
    if bind_host not in ("", "0.0.0.0", "::"):
        return bind_host
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent; picks the outbound interface
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()
