"""A small-order ed25519 key at a real P2P listener: the identity point with R = identity,
S = 0 verifies for any transcript (no secret at all), so the listener must refuse the key
itself, even where its membership check would let it in; honest peers are served on."""

from __future__ import annotations

import logging

import pytest
from psyche_client.p2p.connection import PeerRefused, dial_peer
from psyche_client.p2p.stats import TransferStats

from tests.integration.test_p2p_frame_bounds import CONFIG, Members, members  # noqa: F401

pytestmark = pytest.mark.timeout(60)

IDENTITY_POINT = (1).to_bytes(32, "little")
FORGED = IDENTITY_POINT + bytes(32)
"""R = the identity point, S = 0: a valid signature of every message under that key
(tests/unit/protocol/test_small_order.py shows the attack without the key check)."""


class NoSecret:
    """An 'identity' with the identity point as its key: it signs anything without a secret."""

    public_key = IDENTITY_POINT

    def sign(self, message: bytes) -> bytes:
        return FORGED


async def test_a_small_order_key_cannot_open_a_link(
    members: Members,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    node = await members.node()
    members.keys.add(IDENTITY_POINT)  # even as a "member", the key itself is refused
    host, port = node.address.rsplit(":", 1)
    with pytest.raises(PeerRefused) as refused:
        await dial_peer(
            node.peer_id,
            host,
            int(port),
            NoSecret(),  # type: ignore[arg-type]
            TransferStats(),
            connect_timeout=2.0,
            handshake_timeout=2.0,
            max_frame_size=CONFIG.max_frame_size,
        )
    assert "small order" in str(refused.value)  # the listener's Rejected names the fault
    assert "small order" in caplog.text
    honest = await members.node()
    digest = node.publish_blob(b"still serving")
    assert await honest.fetch_blob(digest, [node.peer_id]) == b"still serving"
