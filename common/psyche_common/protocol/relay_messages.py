"""Frames of the relay port: how two clients that cannot connect to each other get a pipe.

After the one-way handshake in `relay_domain(run_id)` a client sends exactly one request:

* `RelayListen{}`: this connection becomes the client's listen channel (one per key; a new one
  replaces the old). The server answers `RelayListening{}` and later pushes
  `RelayIncoming{peer, token}` for every peer that wants a pipe to it; the client sends `Ping{}`
  to keep the channel open.
* `RelayDial{peer}`: asks for a pipe to `peer`. The server tells the peer (`RelayIncoming`) and
  waits for it to connect with `RelayAccept{token}`.
* `RelayAccept{token}`: the second end of a pipe that a `RelayIncoming` announced.

When both ends are there the server sends each `RelayConnected{peer}` and from then on copies
bytes between the two sockets unchanged: the two clients run the ordinary P2P handshake and
protocol through the pipe (the dialer as P2P dialer, the accepting end as listener), so the
relay never sees a key it could use and cannot impersonate either client. A refusal at any
point is a `Rejected{reason}` frame, then the server closes the connection.
"""

from __future__ import annotations

from typing import Any

from .framing import ProtocolError
from .identity import PUBLIC_KEY_SIZE

TOKEN_SIZE = 16
REQUEST_TYPES = frozenset({"RelayListen", "RelayDial", "RelayAccept"})


class RelayRefused(ProtocolError):
    """The relay refused a request (the reason says why)."""


def _only(message: dict[str, Any], kind: str, *fields: str) -> None:
    extra = set(message) - {"type", *fields}
    if extra:
        raise ProtocolError(f"{kind} has unknown fields {sorted(extra)}")


def _key(message: dict[str, Any], kind: str, name: str) -> bytes:
    value = message.get(name)
    if not isinstance(value, bytes) or len(value) != PUBLIC_KEY_SIZE:
        raise ProtocolError(f"{kind}.{name} must be a {PUBLIC_KEY_SIZE}-byte key")
    return value


def parse_request(message: object) -> tuple[str, bytes]:
    """`(kind, argument)` of a client's relay request: the peer key for `RelayDial`, the
    token for `RelayAccept`, b"" for `RelayListen`. Raises `ProtocolError` naming the field."""
    if not isinstance(message, dict) or message.get("type") not in REQUEST_TYPES:
        got = message.get("type") if isinstance(message, dict) else type(message).__name__
        raise ProtocolError(f"expected RelayListen, RelayDial or RelayAccept, got {got!r}")
    kind = str(message["type"])
    if kind == "RelayListen":
        _only(message, kind)
        return kind, b""
    if kind == "RelayDial":
        _only(message, kind, "peer")
        return kind, _key(message, kind, "peer")
    _only(message, kind, "token")
    token = message.get("token")
    if not isinstance(token, bytes) or len(token) != TOKEN_SIZE:
        raise ProtocolError(f"RelayAccept.token must be {TOKEN_SIZE} bytes")
    return kind, token


def parse_incoming(message: object) -> tuple[bytes, bytes]:
    """`(peer, token)` of a `RelayIncoming` pushed on a listen channel."""
    if not isinstance(message, dict) or message.get("type") != "RelayIncoming":
        raise ProtocolError(f"expected RelayIncoming, got {_type_of(message)!r}")
    _only(message, "RelayIncoming", "peer", "token")
    token = message.get("token")
    if not isinstance(token, bytes) or len(token) != TOKEN_SIZE:
        raise ProtocolError(f"RelayIncoming.token must be {TOKEN_SIZE} bytes")
    return _key(message, "RelayIncoming", "peer"), token


def expect(message: object, kind: str) -> dict[str, Any]:
    """`message` if it is a `kind` frame; `RelayRefused` with the reason for a `Rejected`."""
    if isinstance(message, dict) and message.get("type") == "Rejected":
        raise RelayRefused(f"the relay refused: {message.get('reason')}")
    if not isinstance(message, dict) or message.get("type") != kind:
        raise ProtocolError(f"expected {kind} from the relay, got {_type_of(message)!r}")
    return message


def _type_of(message: object) -> object:
    return message.get("type") if isinstance(message, dict) else type(message).__name__
