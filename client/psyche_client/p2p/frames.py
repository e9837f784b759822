"""What a P2P link frame may hold, checked before and after its bytes are decoded.

A link frame comes from an authenticated member, but one member must not stall its peers: a
frame may be up to `max_frame_size` bytes (a chunk of a blob, carried as one msgpack bin), and
decoding a frame of that size holding only small values would cost the event loop a fraction
of a second and some hundred MiB. So every link frame is decoded within `LINK_DECODE`
(`psyche_common.protocol.framing.check_shape` walks the headers first and refuses a frame
past those bounds before msgpack builds anything), and then has to be one of the frames below,
with known fields of the right types only (`check_link_frame`). A frame that fails either
check raises `BadFrame`, which closes the link (`link.PeerLink`).

A frame of another type may carry only `type`, `sid` and `reason`: a peer's unknown request
is answered `Error` (`serving`), never decoded into anything larger.
"""

from __future__ import annotations

from typing import Any

from psyche_common.protocol import BadFrame, DecodeBounds

LINK_DECODE = DecodeBounds(max_entries=16, max_depth=2, max_values=64)
"""The largest link frame, `Announce`, is a map of 3 fields holding an announcement map of 10:
27 values at depth 2."""

MAX_TEXT = 1024
"""The longest string field (a type, status or reason; a parameter name)."""

_KINDS: dict[str, type | tuple[type, ...]] = {
    "int": int,
    "bytes": bytes,
    "str": str,
    "map": dict,
}

LINK_FRAMES: dict[str, dict[str, str]] = {
    "Ping": {},
    "Announce": {"announcement": "map"},
    "Ack": {"status": "str", "reason": "str"},
    "GetBlob": {"hash": "bytes"},
    "GetManifest": {},
    "GetParameter": {"name": "str"},
    "BlobHeader": {"size": "int"},
    "Chunk": {"data": "bytes"},
    "NotFound": {"reason": "str"},
    "NotShared": {"reason": "str"},
    "Error": {"reason": "str"},
    "Rejected": {"reason": "str"},
}
"""Each link frame's fields beyond `type` and `sid`, and their kinds."""

_OTHER: dict[str, str] = {"reason": "str"}


def check_link_frame(message: dict[str, Any]) -> None:
    """Raise `BadFrame` naming the field unless `message` (a decoded map with a string
    `type`) is a link frame of known fields with values of their kinds."""
    kind = message["type"]
    if len(kind) > MAX_TEXT:
        raise BadFrame(f"P2P frame type of {len(kind)} characters")
    fields = LINK_FRAMES.get(kind, _OTHER)
    for name, value in message.items():
        if name == "type":
            continue
        expected = "int" if name == "sid" else fields.get(name) if isinstance(name, str) else None
        if expected is None:
            raise BadFrame(f"P2P {kind!r} frame has an unknown field {name!r}")
        if isinstance(value, bool) or not isinstance(value, _KINDS[expected]):
            got = type(value).__name__
            raise BadFrame(f"P2P {kind!r} frame: {name} must be {expected}, got {got}")
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise BadFrame(f"P2P {kind!r} frame: {name} of {len(value)} characters")
