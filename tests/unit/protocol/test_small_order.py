"""ed25519 public keys of small order: computed (`small_order`), and refused before any
signature check (`identity.check_public_key`, `verify_signature`, the handshakes'
`identity_key`, authorizations)."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from psyche_client.p2p.connection import read_hello
from psyche_common.protocol import HandshakeError, Identity, verify_signature
from psyche_common.protocol.authorization import (
    Authorization,
    AuthorizationError,
    decode_authorization,
    encode_authorization,
    parse_authorized_keys,
    parse_public_key,
    sign_authorization,
)
from psyche_common.protocol.handshake import read_response, signed_key
from psyche_common.protocol.identity import (
    SmallOrderKey,
    check_public_key,
    is_small_order_key,
)
from psyche_common.protocol.small_order import (
    GROUP_ORDER,
    IDENTITY,
    SMALL_ORDER_ENCODINGS,
    P,
    add,
    decode,
    is_small_order,
    multiply,
    torsion_points,
)

IDENTITY_KEY = (1).to_bytes(32, "little")
NO_SECRET_SIGNATURE = IDENTITY_KEY + bytes(32)  # R = the identity point, S = 0
SMALL_ORDER = sorted(SMALL_ORDER_ENCODINGS)


def _order(point: tuple[int, int]) -> int:
    for order in (1, 2, 4, 8):
        if multiply(order, point) == IDENTITY:
            return order
    raise AssertionError(f"{point} is not of small order")


def test_the_set_is_every_encoding_of_the_eight_small_order_points() -> None:
    points = torsion_points()
    assert sorted(_order(point) for point in points) == [1, 2, 4, 4, 8, 8, 8, 8]
    # 5 y values (1, -1, 0 and two of order 8), both sign bits each, and y + p for y = 0, 1
    assert len(SMALL_ORDER_ENCODINGS) == 14
    for encoding in SMALL_ORDER_ENCODINGS:
        point = decode(encoding)
        assert point is not None and point in points
        assert is_small_order(encoding)
    non_canonical = [e for e in SMALL_ORDER_ENCODINGS if int.from_bytes(e, "little") % 2**255 >= P]
    assert len(non_canonical) == 4


def test_the_arithmetic_is_a_group_of_order_8_l() -> None:
    base = decode((4 * pow(5, P - 2, P) % P).to_bytes(32, "little"))  # y = 4/5: the base point
    assert base is not None
    assert multiply(GROUP_ORDER, base) == IDENTITY
    assert multiply(2, base) == add(base, base) != IDENTITY
    honest = Identity.from_secret_bytes(bytes(range(32))).public_key
    honest_point = decode(honest)
    assert honest_point is not None and multiply(GROUP_ORDER, honest_point) == IDENTITY
    assert not is_small_order(honest)


def test_the_attack_is_real_without_the_check() -> None:
    """Under plain ed25519 verification the identity key accepts R = identity, S = 0 for any
    message, and each small-order key accepts it for some message: no secret is needed."""
    Ed25519PublicKey.from_public_bytes(IDENTITY_KEY).verify(NO_SECRET_SIGNATURE, b"anything")
    for encoding in SMALL_ORDER:
        key = Ed25519PublicKey.from_public_bytes(encoding)
        verified = 0
        for index in range(64):
            try:
                key.verify(NO_SECRET_SIGNATURE, b"message %d" % index)
                verified += 1
            except InvalidSignature:
                pass
        assert verified > 0, encoding.hex()


@pytest.mark.parametrize("encoding", SMALL_ORDER, ids=lambda e: e.hex()[:8] + e.hex()[-2:])
def test_every_small_order_key_is_refused(encoding: bytes) -> None:
    assert is_small_order_key(encoding)
    with pytest.raises(SmallOrderKey, match="small order"):
        check_public_key(encoding, "the peer's key")
    assert not verify_signature(encoding, b"anything", NO_SECRET_SIGNATURE)
    with pytest.raises(HandshakeError, match=r"Proof\.public_key .* small order"):
        signed_key({"type": "Proof", "public_key": encoding, "signature": bytes(64)}, "Proof")
    response = {
        "type": "ChallengeResponse",
        "public_key": encoding,
        "ephemeral": bytes(32),
        "signature": bytes(64),
    }
    with pytest.raises(HandshakeError, match="small order"):
        read_response(response)
    hello = {
        "type": "Hello",
        "challenge": bytes(32),
        "public_key": encoding,
        "ephemeral": bytes(32),
    }
    with pytest.raises(HandshakeError, match=r"Hello\.public_key .* small order"):
        read_hello(hello)
    with pytest.raises(AuthorizationError, match="small order"):
        parse_public_key(encoding.hex())


def test_an_ordinary_key_still_works() -> None:
    identity = Identity.generate()
    assert not is_small_order_key(identity.public_key)
    assert check_public_key(identity.public_key) == identity.public_key
    assert verify_signature(identity.public_key, b"data", identity.sign(b"data"))
    assert parse_public_key(identity.public_key.hex()) == identity.public_key
    message = {"type": "Proof", "public_key": identity.public_key, "signature": bytes(64)}
    assert signed_key(message, "Proof")[0] == identity.public_key


def test_a_small_order_key_is_refused_in_an_authorization_and_a_keys_file() -> None:
    authorizer = Identity.generate()
    delegate = Identity.generate().public_key
    forged = Authorization("run", IDENTITY_KEY, (delegate,), 10**9, NO_SECRET_SIGNATURE)
    with pytest.raises(AuthorizationError, match=r"authorization\.authorizer .* small order"):
        decode_authorization(encode_authorization(forged))
    with pytest.raises(AuthorizationError, match=r"delegates\[0\] .* small order"):
        sign_authorization(authorizer, "run", [IDENTITY_KEY], 10**9)
    with pytest.raises(AuthorizationError, match=r"line 2: .* small order"):
        parse_authorized_keys(f"{authorizer.public_key.hex()}\n{IDENTITY_KEY.hex()}\n")


def test_a_check_per_call_is_one_lookup() -> None:
    digest = hashlib.sha256(b"not a point of small order").digest()
    assert not is_small_order_key(digest)
    assert isinstance(SMALL_ORDER_ENCODINGS, frozenset)
