"""Relay frames: requests parsed strictly, refusals raised with the relay's reason."""

from __future__ import annotations

import pytest
from psyche_common.protocol import ProtocolError
from psyche_common.protocol.relay_messages import (
    RelayRefused,
    expect,
    parse_incoming,
    parse_request,
)

KEY = b"k" * 32
TOKEN = b"t" * 16


def test_the_three_requests() -> None:
    assert parse_request({"type": "RelayListen"}) == ("RelayListen", b"")
    assert parse_request({"type": "RelayDial", "peer": KEY}) == ("RelayDial", KEY)
    assert parse_request({"type": "RelayAccept", "token": TOKEN}) == ("RelayAccept", TOKEN)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"type": "Join"}, "expected RelayListen, RelayDial or RelayAccept, got 'Join'"),
        ([1, 2], "got 'list'"),
        ({"type": "RelayDial", "peer": b"short"}, "RelayDial.peer must be a 32-byte key"),
        ({"type": "RelayDial", "peer": KEY, "x": 1}, r"RelayDial has unknown fields \['x'\]"),
        ({"type": "RelayAccept", "token": b"t"}, "RelayAccept.token must be 16 bytes"),
        ({"type": "RelayListen", "peer": KEY}, "RelayListen has unknown fields"),
    ],
)
def test_bad_requests_name_the_field(message: object, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        parse_request(message)


def test_incoming_and_expected_frames() -> None:
    assert parse_incoming({"type": "RelayIncoming", "peer": KEY, "token": TOKEN}) == (KEY, TOKEN)
    with pytest.raises(ProtocolError, match=r"RelayIncoming\.token must be 16 bytes"):
        parse_incoming({"type": "RelayIncoming", "peer": KEY, "token": b""})
    assert expect({"type": "RelayConnected", "peer": KEY}, "RelayConnected")["peer"] == KEY
    with pytest.raises(RelayRefused, match="the relay refused: no such peer"):
        expect({"type": "Rejected", "reason": "no such peer"}, "RelayConnected")
    with pytest.raises(ProtocolError, match="expected RelayConnected from the relay, got 'Ping'"):
        expect({"type": "Ping"}, "RelayConnected")
