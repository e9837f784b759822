"""The encrypted link after a handshake: key agreement, tampering, replays, the server's key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from psyche_common.protocol import (
    CONTROL_FRAME_SIZE,
    BadFrame,
    FrameAuthenticationError,
    FrameTooLarge,
    HandshakeError,
    Identity,
    ProtocolError,
    SecureChannel,
    ServerKeyMismatch,
    accept_handshake,
    connect_handshake,
    coordinator_domain,
    encode_frame,
    read_frame,
)
from psyche_common.protocol.secure_channel import (
    SEAL_INTO_MIN,
    TAG_SIZE,
    ChannelKeys,
    EphemeralKey,
    ExchangeError,
    derive_keys,
    transcript_hash,
)

DOMAIN = coordinator_domain("run")


def _pair() -> tuple[ChannelKeys, ChannelKeys]:
    a, b = EphemeralKey(), EphemeralKey()
    transcript = transcript_hash(b"test", a.public, b.public)
    return (
        derive_keys(a.exchange(b.public), transcript, initiator=True),
        derive_keys(b.exchange(a.public), transcript, initiator=False),
    )


def _receiver(keys: ChannelKeys, data: bytes) -> SecureChannel:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return SecureChannel(reader, cast(asyncio.StreamWriter, None), keys, peer="peer 0a0b0c0d")


def _sender(keys: ChannelKeys) -> SecureChannel:
    return SecureChannel(
        asyncio.StreamReader(), cast(asyncio.StreamWriter, None), keys, peer="peer 01020304"
    )


def test_key_agreement_gives_each_direction_its_own_key() -> None:
    client, server = _pair()
    assert client.send == server.receive and client.receive == server.send
    assert client.send != client.receive
    other_client, _ = _pair()  # a new exchange: new keys
    assert other_client.send != client.send
    # another transcript (another run, key or nonce) with the same secret: other keys
    a, b = EphemeralKey(), EphemeralKey()
    secret = a.exchange(b.public)
    assert derive_keys(secret, b"t1", initiator=True) != derive_keys(secret, b"t2", initiator=True)


async def test_control_frames_on_the_link_keep_the_pre_authentication_bounds() -> None:
    """After the handshake a peer that has not joined yet still sends control frames: sealed,
    but at most `CONTROL_FRAME_SIZE` bytes of plaintext and decoded within `CONTROL_DECODE`."""
    client, server = _pair()
    sender = _sender(client)
    wide = b"\xdc" + (17).to_bytes(2, "big") + b"\x90" * 17  # an array of 17 empty arrays
    deep = {"a": {"b": {"c": 1}}}
    frames = [
        sender.seal({"type": "RelayDial", "peer": b"k" * 32}),
        sender.seal_payload(wide),
        sender.seal(deep),
        sender.seal(b"x" * CONTROL_FRAME_SIZE),
    ]
    receiver = _receiver(server, b"".join(frames))
    assert await receiver.read_control(timeout=1) == {"type": "RelayDial", "peer": b"k" * 32}
    with pytest.raises(BadFrame, match="max_array_len"):
        await receiver.read_control(timeout=1)
    with pytest.raises(BadFrame, match="deeper than 2"):
        await receiver.read_control(timeout=1)
    with pytest.raises(FrameTooLarge, match=f"maximum of {CONTROL_FRAME_SIZE} bytes"):
        await receiver.read_control(timeout=1)
    # the same frames are fine for a joined peer's link (no bounds)
    sender = _sender(client)
    receiver = _receiver(server, sender.seal_payload(wide) + sender.seal(deep))
    assert len(await receiver.read(timeout=1)) == 17
    assert await receiver.read(timeout=1) == deep


async def test_frames_round_trip_and_nothing_but_the_length_is_readable() -> None:
    client, server = _pair()
    sender = _sender(client)
    frames = [sender.seal({"type": "Join", "run_id": "secret-run"}), sender.seal({"n": 2})]
    assert all(b"secret-run" not in frame and b"Join" not in frame for frame in frames)
    assert frames[0] != sender.seal({"type": "Join", "run_id": "secret-run"})  # new nonce
    receiver = _receiver(server, b"".join(frames))
    assert await receiver.read(timeout=1) == {"type": "Join", "run_id": "secret-run"}
    assert await receiver.read(timeout=1) == {"n": 2}


@pytest.mark.parametrize("size", [0, 1000, SEAL_INTO_MIN - 1, SEAL_INTO_MIN, 256 * 1024 + 40])
async def test_a_frame_is_its_length_then_the_aes_gcm_of_its_payload(size: int) -> None:
    """Small payloads are encrypted and joined to the prefix, large ones encrypted straight into
    the frame's buffer: both give the documented frame (the 4-byte length of ciphertext + tag,
    then AES-256-GCM under the frame's number as a 96-bit big-endian nonce, with the length
    as associated data), and the frames open in order."""
    client, server = _pair()
    sender = _sender(client)
    payloads = [bytes([n]) * size for n in (1, 2, 3)]
    frames = [sender.seal_payload(payload) for payload in payloads]
    header = (size + TAG_SIZE).to_bytes(4, "big")
    for number, (payload, frame) in enumerate(zip(payloads, frames, strict=True)):
        nonce = number.to_bytes(12, "big")
        assert bytes(frame) == header + AESGCM(client.send).encrypt(nonce, payload, header)
    receiver = _receiver(server, b"".join(frames))
    for payload in payloads:
        assert await receiver.read_payload(size, timeout=1) == payload


@pytest.mark.parametrize("position", [4, 10, -1])
async def test_a_flipped_byte_fails_authentication(position: int) -> None:
    client, server = _pair()
    frame = bytearray(_sender(client).seal({"type": "Witness", "x": b"w" * 40}))
    frame[position] ^= 0x01
    receiver = _receiver(server, bytes(frame))
    with pytest.raises(FrameAuthenticationError, match="peer 0a0b0c0d"):
        await receiver.read(timeout=1)


@pytest.mark.parametrize("position", [0, 3])
async def test_a_flipped_length_byte_ends_the_link(position: int) -> None:
    """A changed length is over the limit, waits for bytes that never come, or ends the frame
    early: every case is an error of the link, never a frame accepted."""
    client, server = _pair()
    frame = bytearray(_sender(client).seal({"type": "Witness", "x": b"w" * 40}))
    frame[position] ^= 0x01
    with pytest.raises(ProtocolError):
        await _receiver(server, bytes(frame)).read(timeout=1)


async def test_replayed_reordered_or_dropped_frames_fail_authentication() -> None:
    client, server = _pair()
    sender = _sender(client)
    first, second, third = (sender.seal({"n": n}) for n in range(3))
    for stream, good in ((first + first, 1), (second + first, 0), (first + third, 1)):
        receiver = _receiver(server, stream)
        for _ in range(good):
            await receiver.read(timeout=1)
        with pytest.raises(FrameAuthenticationError, match="failed authentication"):
            await receiver.read(timeout=1)


async def test_frames_of_the_other_direction_or_another_link_fail() -> None:
    client, server = _pair()
    reflected = _sender(server).seal({"n": 0})  # the server's own frame sent back to it
    with pytest.raises(FrameAuthenticationError):
        await _receiver(server, reflected).read(timeout=1)
    _, other_server = _pair()
    with pytest.raises(FrameAuthenticationError):
        await _receiver(other_server, _sender(client).seal({"n": 0})).read(timeout=1)


async def test_the_length_prefix_is_authenticated_and_bounded() -> None:
    client, server = _pair()
    frame = _sender(client).seal({"n": 0})
    truncated = (len(frame) - 4 - 1).to_bytes(4, "big") + frame[4:-1]
    with pytest.raises(FrameAuthenticationError):
        await _receiver(server, truncated).read(timeout=1)
    too_short = (TAG_SIZE - 1).to_bytes(4, "big") + b"x" * (TAG_SIZE - 1)
    with pytest.raises(FrameAuthenticationError, match="shorter than its tag"):
        await _receiver(server, too_short).read(timeout=1)


def test_unusable_ephemeral_keys_are_refused() -> None:
    key = EphemeralKey()
    with pytest.raises(ExchangeError, match="32 bytes"):
        key.exchange(b"short")
    with pytest.raises(ExchangeError):
        key.exchange(bytes(32))  # a low-order point: the shared secret would be all zeros


# ---- the server handshake over loopback ---------------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _listening(handler: Handler) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    async with server:
        yield int(server.sockets[0].getsockname()[1])


async def test_client_and_server_talk_both_ways_after_the_handshake() -> None:
    server_identity, client_identity = Identity.generate(), Identity.generate()
    seen: list[Any] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = await accept_handshake(reader, writer, server_identity, domain=DOMAIN)
        assert accepted.peer_key == client_identity.public_key
        seen.append(await accepted.channel.read(timeout=2))
        await accepted.channel.send({"type": "Reply", "to": seen[-1]["n"]})
        writer.close()

    async with _listening(serve) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        channel = await connect_handshake(
            reader, writer, client_identity, domain=DOMAIN, server_key=server_identity.public_key
        )
        await channel.send({"type": "Ask", "n": 7})
        assert await channel.read(timeout=2) == {"type": "Reply", "to": 7}
        writer.close()
    assert seen == [{"type": "Ask", "n": 7}]


async def test_a_wrong_server_key_is_refused_before_the_client_signs() -> None:
    expected = Identity.generate().public_key
    received: list[Any] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await accept_handshake(reader, writer, Identity.generate(), domain=DOMAIN, timeout=2)
        except Exception as exc:
            received.append(exc)
        writer.close()

    async with _listening(serve) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises(ServerKeyMismatch, match=expected.hex()):
            await connect_handshake(
                reader, writer, Identity.generate(), domain=DOMAIN, server_key=expected, timeout=2
            )
        writer.close()
        await asyncio.sleep(0.1)
    assert received and not isinstance(received[0], TimeoutError)  # nothing signed was sent


async def test_a_server_that_claims_a_key_it_does_not_hold_is_refused() -> None:
    """A man in the middle announces the real server's key but cannot sign the Welcome."""
    real = Identity.generate()
    impostor = Identity.generate()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from psyche_common.protocol import handshake

        ephemeral = EphemeralKey()
        hello = handshake.ServerHello(handshake.new_challenge(), real.public_key, ephemeral.public)
        writer.write(encode_frame(hello.to_wire()))
        reply = handshake.read_response(await read_frame(reader, 4096, timeout=2))
        transcript = handshake.server_transcript(hello, reply.public_key, reply.ephemeral)
        keys = derive_keys(
            ephemeral.exchange(reply.ephemeral),
            transcript_hash(DOMAIN, transcript),
            initiator=False,
        )
        channel = SecureChannel(reader, writer, keys, peer="client")
        forged = impostor.sign(DOMAIN + b"server" + transcript)
        await channel.send({"type": "Welcome", "signature": forged})
        await asyncio.sleep(0.5)
        writer.close()

    async with _listening(serve) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises(HandshakeError, match="Welcome signature does not verify"):
            await connect_handshake(
                reader, writer, Identity.generate(), domain=DOMAIN, server_key=real.public_key
            )
        writer.close()


async def test_a_refused_handshake_names_the_servers_reason() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await accept_handshake(
                reader, writer, Identity.generate(), domain=coordinator_domain("other-run")
            )
        except HandshakeError as exc:
            writer.write(encode_frame({"type": "Rejected", "reason": f"wrong run: {exc}"}))
            await writer.drain()
        writer.close()

    async with _listening(serve) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises(HandshakeError, match="server rejected the connection: wrong run"):
            await connect_handshake(reader, writer, Identity.generate(), domain=DOMAIN, timeout=2)
        writer.close()
