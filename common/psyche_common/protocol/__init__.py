"""Wire protocol shared by the server, the clients and the P2P layer.

- `framing`: 4-byte big-endian length + msgpack frames, size limits, typed errors.
- `identity`: ed25519 identities (client id = raw 32-byte public key).
- `handshake`: challenge–response authentication of a stream's peers and its link keys.
- `secure_channel`: the encrypted, authenticated frames every link carries after its handshake.
- `messages`: validated client↔server messages (see docs/protocol.md).
"""

from psyche_common.client_id import short_id

from .framing import (
    CONTROL_DECODE,
    CONTROL_FRAME_SIZE,
    DEFAULT_MAX_FRAME_SIZE,
    BadFrame,
    ConnectionClosed,
    DecodeBounds,
    FrameTooLarge,
    ProtocolError,
    decode_payload,
    encode_frame,
    encode_payload,
    read_control_frame,
    read_frame,
    read_frame_bytes,
    write_frame,
)
from .handshake import (
    HANDSHAKE_FRAME_SIZE,
    P2P_DOMAIN,
    Accepted,
    HandshakeError,
    HandshakeRefused,
    ServerKeyMismatch,
    accept_handshake,
    accept_handshake_in,
    connect_handshake,
    coordinator_domain,
    data_server_domain,
    relay_domain,
    sign_challenge,
)
from .identity import Identity, verify_signature
from .messages import (
    Checkpoint,
    CoordinatorState,
    HealthCheck,
    HealthCheckEntry,
    InvalidMessage,
    Join,
    Rejected,
    WarmupWitness,
    Witness,
    WitnessMetadata,
    parse_client_message,
    parse_server_message,
    to_wire,
)
from .secure_channel import FrameAuthenticationError, SecureChannel

__all__ = [
    "CONTROL_DECODE",
    "CONTROL_FRAME_SIZE",
    "DEFAULT_MAX_FRAME_SIZE",
    "HANDSHAKE_FRAME_SIZE",
    "P2P_DOMAIN",
    "Accepted",
    "BadFrame",
    "Checkpoint",
    "ConnectionClosed",
    "CoordinatorState",
    "DecodeBounds",
    "FrameAuthenticationError",
    "FrameTooLarge",
    "HandshakeError",
    "HandshakeRefused",
    "HealthCheck",
    "HealthCheckEntry",
    "Identity",
    "InvalidMessage",
    "Join",
    "ProtocolError",
    "Rejected",
    "SecureChannel",
    "ServerKeyMismatch",
    "WarmupWitness",
    "Witness",
    "WitnessMetadata",
    "accept_handshake",
    "accept_handshake_in",
    "connect_handshake",
    "coordinator_domain",
    "data_server_domain",
    "decode_payload",
    "encode_frame",
    "encode_payload",
    "parse_client_message",
    "parse_server_message",
    "read_control_frame",
    "read_frame",
    "read_frame_bytes",
    "relay_domain",
    "short_id",
    "sign_challenge",
    "to_wire",
    "verify_signature",
    "write_frame",
]
