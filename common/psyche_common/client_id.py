"""Client ids: a client's raw 32-byte ed25519 public key, and the short form logs display."""

from __future__ import annotations

CLIENT_ID_LEN = 32


def short_id(client_id: bytes) -> str:
    """Display form of a client id: its first 4 bytes in hex (8 characters)."""
    return bytes(client_id[:4]).hex()
