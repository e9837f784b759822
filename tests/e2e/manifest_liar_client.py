"""A test-only manifest liar: a member that serves late joiners other weights than it holds.

It is `psyche-client` with one change, in its P2P node (`Parts(node=...)`): its answers to
`GetManifest` and `GetParameter` describe and carry its shared model with the first byte of
every parameter flipped, and the manifest lists the hashes of those flipped bytes, so a joiner
that trusted it alone would download, verify and load wrong weights. It trains, joins and
announces normally. Every lying manifest is logged as `manifest_liar: served a lying
manifest`. Run it with `psyche-client`'s arguments:
`python tests/e2e/manifest_liar_client.py train --server-addr ...`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psyche_client.app.parts import Parts
from psyche_client.p2p.manifest import ModelManifest, parameter_info
from psyche_client.p2p.node import P2PNode

log = logging.getLogger("psyche.client")


def flipped(data: bytes) -> bytes:
    return bytes([data[0] ^ 0xFF]) + data[1:] if data else data


class LyingNode(P2PNode):
    def _lie(self) -> tuple[ModelManifest, dict[str, bytes]] | None:
        manifest = self._requests._get_manifest() if self._requests._get_manifest else None
        provider = self._requests._get_parameter_bytes
        if manifest is None or provider is None:
            return None
        parameters: dict[str, bytes] = {}
        for info in manifest.parameters:
            data = provider(info.name)
            if data is None:
                return None
            parameters[info.name] = flipped(data)
        lie = ModelManifest.build(
            step=manifest.step,
            epoch=manifest.epoch,
            parameters=[
                parameter_info(info.name, info.dtype, info.shape, parameters[info.name])
                for info in manifest.parameters
            ],
            config_json=manifest.config_json,
            tokenizer_json=manifest.tokenizer_json,
        )
        return lie, parameters

    async def _handle(self, conn: Any, peer_id: bytes, request: dict[str, Any]) -> None:
        kind = request.get("type")
        if kind not in ("GetManifest", "GetParameter"):
            await super()._handle(conn, peer_id, request)
            return
        conn.bulk = True
        lie = self._lie()
        if lie is None:
            await self._answer(conn, "manifest", b"", None)
            return
        manifest, parameters = lie
        if kind == "GetManifest":
            log.info("manifest_liar: served a lying manifest", extra={"step": manifest.step})
            await self._answer(conn, "manifest", b"", manifest.encode())
        else:
            name = request.get("name")
            data = parameters.get(name) if isinstance(name, str) else None
            await self._answer(conn, "parameter", name, data)


def main() -> None:
    from psyche_client.cli import main as client_main

    client_main(obj=Parts(node=LyingNode))


if __name__ == "__main__":
    main()
