"""Where a rank is right now, in a small shared file the kernel reads without the rank's help."""

from __future__ import annotations

import os
import struct
import time

DDP_GRADIENTS = "DDP gradient all_reduce"  # what the DDP slot records (``enter_ddp``)


class ProgressRecord:
    """Where a rank is, readable by the kernel at any moment without the rank's help: a small shared file
    (mmap) that each collective updates on entry and exit. For hang diagnosis: which collective, its sequence
    number, since when, called from where, at which DDP step, and when the rank last completed one.

    Layout (little-endian, 488 bytes): sequence number (u64), entered at (f64, monotonic), inside a collective
    (u8), operation (32 bytes), call site (200 bytes), 7 bytes of padding, step (u64 at offset 256; DDP's
    iteration count for DDP's own collectives, else 0), progressed at (f64 at offset 264, monotonic; when the
    rank last left a collective, 0.0 before any); then the DDP slot, for DDP's gradient all_reduce, the one
    collective a rank enters at every training step, written with as little as possible (two integers on
    entry, one on exit; no clock, no text): its step (u64 at 272), its sequence number times two plus one
    while inside (u64 at 280), and the call site of its backward (200 bytes at 288, written on the steps
    DDP's watch samples). ``read()`` gives the innermost of the two as a dict (see the keys there); the
    DDP slot's "since" is 0.0 (unknown: the reader times it, ``HangWatch``).
    ``enter`` writes everything but "progressed at", ``leave`` only that and the "inside" byte: a DDP
    collective may complete on another thread while the rank's main thread enters the next one.

    The rank's own side also adds up ``waited``, the seconds spent inside collectives (for the run's balance:
    who waits for whom), and calls ``on_due`` at the first ``leave`` after ``due`` (monotonic), so a meter can
    report a few times a minute without a thread or a clock read of its own.
    """

    _LAYOUT = struct.Struct("<QdB32s200s7xQdQQ200s")
    _ENTRY = struct.Struct("<QdB32s200s7xQ")  # what enter() writes
    _INSIDE = 16  # offset of the "inside" byte
    _PROGRESSED = struct.Struct("<d")
    _PROGRESSED_AT = _ENTRY.size
    _DDP_SLOT = 272  # the DDP slot: step, sequence * 2 + inside (u64 each), then its call site
    _DDP_SITE = struct.Struct("<200s")

    def __init__(self, path: str, create: bool = False):
        """The record at ``path`` (a rank's side); ``create``: the kernel's, fresh and zeroed for an attempt, named
        by ``path`` and held in memory (``reserve``): ``self.path`` is then what a rank opens."""
        import mmap

        self._memory = -1  # create: the in-memory file this process holds open for the ranks
        if create:
            self._memory, self.path = reserve(path, self._LAYOUT.size)
            descriptor = self._memory
        else:
            self.path, descriptor = path, os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(descriptor, self._LAYOUT.size)
        finally:
            if not create:
                os.close(descriptor)
        self._ddp = memoryview(self._map)[self._DDP_SLOT:self._DDP_SLOT + 16].cast("Q")
        self.sequence = 0
        self.waited = 0.0
        self._entered = 0.0
        self.due = float("inf")
        self.on_due = None

    def enter(self, operation: str, call_site: str, step: int = 0) -> None:
        """Entering collective ``operation`` (number ``sequence + 1``) from ``call_site``, at DDP ``step``."""
        self.sequence += 1
        self._entered = now = time.monotonic()
        self._ENTRY.pack_into(self._map, 0, self.sequence, now, 1, operation.encode()[:32],
                              call_site.encode("utf-8", "replace")[:200], step)

    def leave(self, waited: float | None = None) -> None:
        """The collective completed: not inside any now, progress made at this moment. ``waited``: the seconds
        of it spent waiting for other ranks, when not all of it was (DDP's backward computes too)."""
        now = time.monotonic()
        self._PROGRESSED.pack_into(self._map, self._PROGRESSED_AT, now)
        self._map[self._INSIDE] = 0
        self.waited += now - self._entered if waited is None else waited
        if now >= self.due:
            self.due = float("inf")
            try:
                self.on_due()
            except Exception:  # noqa: BLE001 - a report that failed must not fail the collective it rode on
                pass

    def enter_ddp(self, step: int) -> int:
        """Entering DDP's gradient all_reduce (number ``sequence + 1``) at ``step``; what ``leave_ddp`` takes."""
        self.sequence += 1
        self._ddp[0] = step
        entered = self._ddp[1] = self.sequence * 2 + 1
        return entered

    def leave_ddp(self, entered: int) -> None:
        """DDP's gradient all_reduce that ``enter_ddp`` returned ``entered`` for has completed (the reader sees
        the progress; the time it waited is the balance meter's)."""
        self._ddp[1] = entered - 1

    def ddp_site(self, call_site: str) -> None:
        """The call site of DDP's backward (the user's ``loss.backward()``), when it is worth writing."""
        self._DDP_SITE.pack_into(self._map, self._DDP_SLOT + 16, call_site.encode("utf-8", "replace")[:200])

    def read(self) -> dict:
        """``sequence``, ``since``, ``inside``, ``operation``, ``call_site``, ``step``, ``progressed_at``: of the
        collective the rank is in (a collective entered inside DDP's backward before DDP's own), else of its
        last one."""
        sequence, since, inside, operation, call_site, step, progressed_at, ddp_step, ddp, ddp_site = \
            self._LAYOUT.unpack_from(self._map, 0)
        if not inside and (ddp % 2 or ddp // 2 > sequence):  # DDP's backward: in it, or the last one
            return {"sequence": ddp // 2, "since": 0.0, "inside": bool(ddp % 2), "operation": DDP_GRADIENTS,
                    "call_site": ddp_site.rstrip(b"\0").decode(errors="replace"), "step": ddp_step,
                    "progressed_at": progressed_at}
        return {"sequence": sequence, "since": since, "inside": bool(inside),
                "operation": operation.rstrip(b"\0").decode(errors="replace"),
                "call_site": call_site.rstrip(b"\0").decode(errors="replace"),
                "step": step, "progressed_at": progressed_at}

    def close(self) -> None:
        self._ddp.release()
        self._map.close()
        if self._memory >= 0:
            os.close(self._memory)
            self._memory = -1


def reserve(name: str, size: int) -> tuple[int, str]:
    """A zeroed in-memory file of ``size`` bytes, its pages allocated now, open for reading and writing, and the
    path a rank opens it by (``/proc/<this pid>/fd/<n>``, while this process keeps it open; ``name`` is what
    /proc shows). Never a file on the runs folder's disk: a page of a sparse file is allocated when first touched,
    and on a full disk that touch is a SIGBUS, in the kernel or in a rank; even a reserved file's page faults
    with SIGBUS once its filesystem has failed (an I/O error, remounted read-only). Pages allocated in memory
    (``posix_fallocate``: a lack of memory is an OSError here, not a fault later) have no disk under them."""
    descriptor = os.memfd_create(os.path.basename(name) or "progress")  # close-on-exec
    try:
        os.posix_fallocate(descriptor, 0, size)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor, f"/proc/{os.getpid()}/fd/{descriptor}"
