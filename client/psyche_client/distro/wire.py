"""Byte-level primitives of the result format: unsigned LEB128 varints and a bounds-checked
reader whose every failure (truncation, non-canonical or oversized varint) raises
`ResultDecodeError` naming what was being read.

API: `ResultDecodeError`, `varint(value) -> bytes`, `Reader(data)` with `.take(size, what)`,
`.struct(layout, what)`, `.varint(what)` and `.remaining()`.
"""

from __future__ import annotations

import struct

U32_MAX = 2**32 - 1


class ResultDecodeError(ValueError):
    """A received result is malformed or does not match the locally expected layout."""


def varint(value: int) -> bytes:
    """Unsigned LEB128 in its shortest form."""
    if value < 0:
        raise ValueError(f"varint cannot encode negative value {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


class Reader:
    """Bounds-checked cursor over a result's bytes; every failure is a `ResultDecodeError`."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def remaining(self) -> int:
        return len(self._data) - self._pos

    def take(self, size: int, what: str) -> bytes:
        if size > self.remaining():
            raise ResultDecodeError(
                f"truncated result: {what} needs {size} bytes, {self.remaining()} left"
            )
        chunk = self._data[self._pos : self._pos + size]
        self._pos += size
        return chunk

    def struct(self, layout: struct.Struct, what: str) -> tuple:
        return layout.unpack(self.take(layout.size, what))

    def varint(self, what: str) -> int:
        value = 0
        for shift in range(0, 35, 7):
            (byte,) = self.take(1, what)
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and shift:
                    raise ResultDecodeError(f"{what}: varint is not in its shortest form")
                if value > U32_MAX:
                    raise ResultDecodeError(f"{what}: value {value} exceeds u32")
                return value
        raise ResultDecodeError(f"{what}: varint longer than 5 bytes")
