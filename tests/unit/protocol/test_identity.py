"""ed25519 identities and the challenge–response handshake (its link: test_secure_channel)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from psyche_common.protocol import (
    P2P_DOMAIN,
    HandshakeError,
    Identity,
    accept_handshake,
    connect_handshake,
    coordinator_domain,
    data_server_domain,
    short_id,
    sign_challenge,
    verify_signature,
)
from psyche_common.protocol.handshake import (
    ServerHello,
    mutual_transcript,
    verify_challenge_response_in,
)
from psyche_common.protocol.secure_channel import EphemeralKey


def test_seed_round_trip_and_hex(tmp_path: Path) -> None:
    ident = Identity.from_secret_bytes(bytes(range(32)))
    assert len(ident.public_key) == 32
    assert Identity.from_hex(bytes(range(32)).hex()).public_key == ident.public_key
    key_file = tmp_path / "id.key"
    ident.save(key_file)
    assert (key_file.stat().st_mode & 0o777) == 0o600
    assert Identity.load(key_file).public_key == ident.public_key
    key_file.write_bytes(bytes(range(32)))
    assert Identity.load(key_file).public_key == ident.public_key
    assert short_id(ident.public_key) == ident.public_key[:4].hex()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (bytes(range(31)), "got 31 bytes"),
        (b"\xff" * 33, "got 33 bytes"),
        (b"", "got 0 bytes"),
        (b"ab" * 31 + b"\n", "got 62 hex characters"),
        (b"zz" * 32, "got 64 bytes"),
    ],
)
def test_a_key_file_of_the_wrong_size_says_what_it_holds(
    tmp_path: Path, content: bytes, why: str
) -> None:
    key_file = tmp_path / "id.key"
    key_file.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        Identity.load(key_file)
    assert str(caught.value) == (
        f"identity file {key_file}: {why}, expected 32 raw bytes or 64 hex characters"
    )


def test_known_vector_rfc8032_test1() -> None:
    secret = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    ident = Identity.from_secret_bytes(secret)
    assert ident.public_key.hex() == (
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    )


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Identity.from_secret_bytes(b"short")
    with pytest.raises(ValueError, match="hex"):
        Identity.from_hex("zz" * 32)
    ident = Identity.generate()
    sig = ident.sign(b"data")
    assert verify_signature(ident.public_key, b"data", sig)
    assert not verify_signature(ident.public_key, b"datA", sig)
    assert not verify_signature(Identity.generate().public_key, b"data", sig)
    assert not verify_signature(b"x" * 31, b"data", sig)
    assert not verify_signature(ident.public_key, b"data", sig[:-1])


def _hello() -> ServerHello:
    return ServerHello(b"c" * 32, Identity.generate().public_key, EphemeralKey().public)


def test_challenge_response_checks() -> None:
    ident = Identity.generate()
    hello = _hello()
    domain = coordinator_domain("run")
    response = sign_challenge(ident, hello, domain, EphemeralKey())
    checked, verified_in = verify_challenge_response_in(hello, response, [domain])
    assert checked.public_key == ident.public_key and verified_in == domain
    other = ServerHello(b"d" * 32, hello.server_key, hello.ephemeral)
    with pytest.raises(HandshakeError, match="does not verify"):
        verify_challenge_response_in(other, response, [domain])
    # the signature names the server's key and ephemeral key: another server's is refused
    for changed in (
        ServerHello(hello.challenge, Identity.generate().public_key, hello.ephemeral),
        ServerHello(hello.challenge, hello.server_key, EphemeralKey().public),
    ):
        with pytest.raises(HandshakeError, match="does not verify"):
            verify_challenge_response_in(changed, response, [domain])
    # and the client's own ephemeral key: a swapped one (a man in the middle's) is refused
    swapped = {**response, "ephemeral": EphemeralKey().public}
    with pytest.raises(HandshakeError, match="does not verify"):
        verify_challenge_response_in(hello, swapped, [domain])
    with pytest.raises(HandshakeError, match="unknown fields"):
        verify_challenge_response_in(hello, {**response, "x": 1}, [domain])
    with pytest.raises(HandshakeError, match="expected a ChallengeResponse"):
        verify_challenge_response_in(hello, [1, 2], [domain])
    with pytest.raises(HandshakeError, match="ephemeral must be 32 bytes"):
        verify_challenge_response_in(hello, {**response, "ephemeral": b"e"}, [domain])


def test_a_signature_for_one_service_or_run_verifies_for_no_other() -> None:
    ident = Identity.generate()
    hello = _hello()
    domains = [
        coordinator_domain("run-a"),
        coordinator_domain("run-b"),
        coordinator_domain("run-a\x00"),
        coordinator_domain(""),
        data_server_domain("run-a"),
        data_server_domain("run-b"),
        P2P_DOMAIN,
    ]
    assert len(set(domains)) == len(domains)
    for signed_for in domains:
        response = sign_challenge(ident, hello, signed_for, EphemeralKey())
        for checked_by in domains:
            if checked_by == signed_for:
                assert verify_challenge_response_in(hello, response, [checked_by])
            else:
                with pytest.raises(HandshakeError, match="does not verify"):
                    verify_challenge_response_in(hello, response, [checked_by])
    # no domain is a prefix of another (a run id cannot be forged into another domain)
    for a in domains:
        for b in domains:
            assert a == b or not b.startswith(a)


def test_mutual_transcripts_differ_by_role_and_by_every_key_and_nonce() -> None:
    parts = [b"L" * 32, b"D" * 32, b"l" * 32, b"d" * 32, b"E" * 32, b"e" * 32]
    base = mutual_transcript("listener", *parts)
    assert base.startswith(P2P_DOMAIN)
    assert mutual_transcript("dialer", *parts) != base
    for index in range(6):
        changed = list(parts)
        changed[index] = b"x" * 32
        assert mutual_transcript("listener", *changed) != base
    with pytest.raises(ValueError, match="role"):
        mutual_transcript("server", *parts)


async def test_handshake_over_loopback() -> None:
    ident = Identity.generate()
    server_identity = Identity.generate()
    result: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            accepted = await accept_handshake(
                reader, writer, server_identity, domain=data_server_domain("r"), timeout=2
            )
            result.set_result(accepted.peer_key)
        except Exception as exc:
            result.set_exception(exc)
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        channel = await connect_handshake(
            reader, writer, ident, domain=data_server_domain("r"), timeout=2
        )
        assert channel.peer_key == server_identity.public_key
        assert await asyncio.wait_for(result, 2) == ident.public_key
        writer.close()
