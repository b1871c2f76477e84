"""Where a rank is right now, in a small shared file the kernel reads without the rank's help."""

from __future__ import annotations

import os
import struct
import time


class ProgressRecord:
    """Where a rank is, readable by the kernel at any moment without the rank's help: a small shared file
    (mmap) that each collective updates on entry and exit. For hang diagnosis: which collective, its sequence
    number, since when, called from where.

    Layout: sequence number (u64), entered at (f64, monotonic), inside a collective (u8), operation (32 bytes),
    call site (200 bytes).
    """

    _LAYOUT = struct.Struct("<QdB32s200s")

    def __init__(self, path: str, create: bool = False):
        import mmap

        self.path = path
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        descriptor = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(descriptor, 0)  # a fresh, zeroed record for each attempt
                os.ftruncate(descriptor, self._LAYOUT.size)
            self._map = mmap.mmap(descriptor, self._LAYOUT.size)
        finally:
            os.close(descriptor)
        self.sequence = 0

    def enter(self, operation: str, call_site: str) -> None:
        self.sequence += 1
        self._LAYOUT.pack_into(self._map, 0, self.sequence, time.monotonic(), 1, operation.encode()[:32],
                               call_site.encode("utf-8", "replace")[:200])

    def leave(self) -> None:
        self._map[16] = 0  # the "inside" byte

    def read(self) -> dict:
        sequence, since, inside, operation, call_site = self._LAYOUT.unpack_from(self._map, 0)
        return {"sequence": sequence, "since": since, "inside": bool(inside),
                "operation": operation.rstrip(b"\0").decode(errors="replace"),
                "call_site": call_site.rstrip(b"\0").decode(errors="replace")}

    def close(self) -> None:
        self._map.close()
