"""A P2P node for `test_priority_e2e`, run as a script inside a lab host.

`holder PORT MODE`: serves a 4 MiB model (4 parameters) and one 63,386-byte result blob
(the size of a `builtin:llama-20m` DisTrO result); prints `{"blob": HASH}` and serves for a
minute. `joiner HOLDER_ADDR MODE BLOB`: downloads the model from the holder and, 2 s into
it, fetches the blob; prints the seconds each took. MODE `plain` turns the upload pacing off
(FIFO writer lock, no yielding to blob answers, the kernel's default send queue): the
control the paced mode is compared with.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator

from psyche_client.p2p import P2PConfig, P2PNode, download_model, pacing, parameter_info
from psyche_client.p2p import link as link_module
from psyche_client.p2p.manifest import ModelManifest
from psyche_common.protocol import Identity

HOLDER = Identity.from_hex("1" * 64)
JOINER = Identity.from_hex("2" * 64)
RESULT_BYTES = 63_386


def turn_pacing_off() -> None:
    link_module.limit_unsent = lambda writer, low_water=0: False  # type: ignore[assignment]
    fifo = pacing.PriorityLock.hold
    pacing.PriorityLock.hold = lambda self, bulk=False: fifo(self, bulk=False)  # type: ignore[method-assign]

    @contextlib.contextmanager
    def no_urgency(self: pacing.UploadShaper) -> Iterator[None]:
        yield

    pacing.UploadShaper.urgent = no_urgency  # type: ignore[method-assign]
    pacing.MAX_BULK_CHUNK = 1 << 30


async def holder(port: int) -> None:
    params = {f"layer{i}": os.urandom(1 << 20) for i in range(4)}
    infos = [parameter_info(name, "uint8", [len(data)], data) for name, data in params.items()]
    manifest = ModelManifest.build(step=1, epoch=0, parameters=infos, config_json="")
    members = {HOLDER.public_key, JOINER.public_key}
    node = P2PNode(
        HOLDER,
        is_member=members.__contains__,
        config=P2PConfig(port=port),
        get_manifest=lambda: manifest,
        get_parameter_bytes=params.get,
    )
    await node.start()
    blob = node.publish_blob(os.urandom(RESULT_BYTES), step=1)
    print(json.dumps({"blob": blob.hex()}), flush=True)
    await asyncio.sleep(60)


async def joiner(address: str, blob: bytes) -> None:
    members = {HOLDER.public_key, JOINER.public_key}
    node = P2PNode(JOINER, is_member=members.__contains__, config=P2PConfig())
    await node.start()
    node.set_peers({HOLDER.public_key: address})
    started = time.monotonic()
    sharing = asyncio.ensure_future(download_model(node, [HOLDER.public_key]))
    await asyncio.sleep(2.0)
    asked = time.monotonic()
    await node.fetch_blob(blob, [HOLDER.public_key], expected_size=RESULT_BYTES)
    fetched = time.monotonic()
    model_done_first = sharing.done()
    download = await sharing
    print(
        json.dumps(
            {
                "blob_seconds": fetched - asked,
                "model_seconds": time.monotonic() - started,
                "model_bytes": sum(len(data) for data in download.parameters.values()),
                "model_done_first": model_done_first,
            }
        ),
        flush=True,
    )
    await node.close()


def main() -> None:
    role, where, mode = sys.argv[1:4]
    if mode == "plain":
        turn_pacing_off()
    if role == "holder":
        asyncio.run(holder(int(where)))
    else:
        asyncio.run(joiner(where, bytes.fromhex(sys.argv[4])))


if __name__ == "__main__":
    main()
