"""ed25519 identities: a client's id is its raw 32-byte public key.

`Identity` wraps a private key (generate / from a 32-byte seed / hex / key file) and signs;
`verify_signature` checks a signature against a raw public key and never raises on bad input;
`check_public_key` refuses a peer's key that needs no secret (a point of small order,
`small_order`), and `verify_signature` refuses those keys before any signature check, so every
handshake and signed statement (authorizations, commitments, announcements, equivocation
proofs, reachability proofs) refuses them.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from psyche_common.client_id import short_id

from .small_order import SMALL_ORDER_ENCODINGS

PUBLIC_KEY_SIZE = 32
SECRET_KEY_SIZE = 32
SIGNATURE_SIZE = 64


class SmallOrderKey(ValueError):
    """A public key that is a point of small order: signatures verify under it without any
    secret (e.g. R the identity and S = 0), so it proves nothing about who holds it."""


def is_small_order_key(public_key: bytes) -> bool:
    """True when `public_key` is any encoding of a point of small order (one set lookup)."""
    return bytes(public_key) in SMALL_ORDER_ENCODINGS


def check_public_key(public_key: bytes, what: str = "public key") -> bytes:
    """`public_key` when it is 32 bytes and not of small order; raises `SmallOrderKey` (a
    `ValueError`) naming `what` and the key otherwise, or `ValueError` for a wrong size."""
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise ValueError(f"{what} must be {PUBLIC_KEY_SIZE} bytes, got {len(public_key)}")
    if is_small_order_key(public_key):
        raise SmallOrderKey(
            f"{what} {bytes(public_key).hex()} is an ed25519 point of small order: signatures "
            "verify under it without any secret key, so it is refused"
        )
    return bytes(public_key)


class Identity:
    """An ed25519 key pair. The public key (raw 32 bytes) is the node's id."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private_key = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw
        )

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_secret_bytes(cls, secret: bytes) -> Identity:
        """From the 32-byte ed25519 seed (the "secret key")."""
        if len(secret) != SECRET_KEY_SIZE:
            raise ValueError(
                f"an ed25519 secret key is {SECRET_KEY_SIZE} bytes, got {len(secret)} bytes"
            )
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(secret)))

    @classmethod
    def from_hex(cls, text: str) -> Identity:
        """From 64 hex characters (whitespace and an optional 0x prefix are ignored)."""
        cleaned = text.strip().removeprefix("0x")
        try:
            secret = bytes.fromhex(cleaned)
        except ValueError as exc:
            raise ValueError(f"secret key is not valid hex: {exc}") from exc
        return cls.from_secret_bytes(secret)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Read a key file: 32 raw bytes, or 64 hex characters (one line; surrounding
        whitespace and a 0x prefix are ignored). Raises ValueError naming the file and what
        it holds instead."""
        data = Path(path).read_bytes()
        if len(data) == SECRET_KEY_SIZE:
            return cls.from_secret_bytes(data)
        expected = f"expected {SECRET_KEY_SIZE} raw bytes or {2 * SECRET_KEY_SIZE} hex characters"
        try:
            text = data.decode("ascii").strip().removeprefix("0x")
            secret = bytes.fromhex(text)
        except ValueError:  # UnicodeDecodeError too: binary data of another length
            text, secret = "", b""
        if not text:
            raise ValueError(f"identity file {path}: got {len(data)} bytes, {expected}")
        if len(secret) != SECRET_KEY_SIZE:
            raise ValueError(f"identity file {path}: got {len(text)} hex characters, {expected}")
        return cls.from_secret_bytes(secret)

    def secret_bytes(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        return self._private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the secret as one hex line, readable only by the owner (mode 0600)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(self.secret_bytes().hex() + "\n")

    def sign(self, data: bytes) -> bytes:
        return self._private_key.sign(bytes(data))

    @property
    def short_id(self) -> str:
        return short_id(self.public_key)

    def __repr__(self) -> str:
        return f"Identity({self.short_id})"


def verify_signature(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """True when `signature` is a valid ed25519 signature of `data` by `public_key`; always
    False for a key of small order (`is_small_order_key`), which any signer could use."""
    if not isinstance(public_key, bytes | bytearray) or len(public_key) != PUBLIC_KEY_SIZE:
        return False
    if is_small_order_key(public_key):
        return False
    if not isinstance(signature, bytes | bytearray) or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(bytes(public_key)).verify(bytes(signature), bytes(data))
    except (InvalidSignature, ValueError):
        return False
    return True
