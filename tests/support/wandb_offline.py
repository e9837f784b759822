"""Reads back what an offline wandb run wrote (`WANDB_MODE=offline`): the records of its
`run-<id>.wandb` file, decoded with wandb's own protobuf schema (`wandb.proto`).

The file is wandb's transaction log: a 7-byte header (`:W&B`, the magic 0xBEE1 little-endian,
version 0) then LevelDB's log format: 32 KiB blocks of chunks, each `crc32c (4) | length (2,
little-endian) | type (1: full, 2: first, 3: middle, 4: last) | data`, a block's last bytes
zero-padded when fewer than 7 remain. Each reassembled chunk sequence is one `Record`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    if not data.startswith(HEADER):
        raise ValueError(f"{path} is not a wandb transaction log")
    found: list[wandb_internal_pb2.Record] = []
    pending = b""
    offset = len(HEADER)
    while offset + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < CHUNK_HEADER:
            offset += left_in_block
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, offset)
        if kind == 0 and length == 0:  # zero padding up to the block's end
            offset += left_in_block
            continue
        chunk = data[offset + CHUNK_HEADER : offset + CHUNK_HEADER + length]
        offset += CHUNK_HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
    return found


@dataclass
class OfflineRun:
    """An offline run's identity and its logged rows (each `history` record as a dict)."""

    name: str = ""
    project: str = ""
    group: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)

    def rows_with(self, key: str) -> list[dict[str, Any]]:
        return [row for row in self.history if key in row]


def read_run(run_dir: Path) -> OfflineRun:
    """The run stored in `run_dir` (a `wandb/offline-run-*` folder)."""
    (log_file,) = run_dir.glob("run-*.wandb")
    run = OfflineRun()
    for record in records(log_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.name, run.project, run.group = (
                record.run.display_name,
                record.run.project,
                record.run.run_group,
            )
        elif kind == "history":
            run.history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return run
