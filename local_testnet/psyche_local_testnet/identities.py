"""Deterministic identities for a local testnet.

Client `n` of a testnet session gets the ed25519 seed SHA-256("psyche-local-testnet", session,
n), so a client that is killed and restarted keeps its id, while two testnets never share ids.
The seed reaches the client as `RAW_IDENTITY_SECRET_KEY` (64 hex characters); its public key
(the client's id) is what the server is told, e.g. with `--checkpointer`. The server gets the
seed SHA-256("psyche-local-testnet", session, "server") in a key file, so a restarted server
keeps its key and the clients check it with `--server-key`.
"""

from __future__ import annotations

import hashlib

from psyche_common.protocol import Identity

IDENTITY_ENV = "RAW_IDENTITY_SECRET_KEY"


def client_secret_key(session: str, client_number: int) -> bytes:
    """The 32-byte ed25519 seed of client `client_number` (1-based) in `session`."""
    if client_number < 1:
        raise ValueError(f"client numbers start at 1, got {client_number}")
    return hashlib.sha256(f"psyche-local-testnet\0{session}\0{client_number}".encode()).digest()


def client_secret_hex(session: str, client_number: int) -> str:
    return client_secret_key(session, client_number).hex()


def server_secret_key(session: str) -> bytes:
    """The 32-byte ed25519 seed of the server of `session`."""
    return hashlib.sha256(f"psyche-local-testnet\0{session}\0server".encode()).digest()


def client_public_hex(session: str, client_number: int) -> str:
    """The public key (the client id, 64 hex characters) of client `client_number`."""
    return Identity.from_secret_bytes(client_secret_key(session, client_number)).public_key.hex()
