"""Where a rank is right now, in a small shared in-memory file the kernel reads without the rank's help."""

from __future__ import annotations

import os
import struct
import threading
import time

DDP_GRADIENTS = "DDP gradient all_reduce"  # what the DDP slot records (``enter_ddp``)
THREAD_SLOTS = 4  # threads of a rank with a slot of their own (the main thread's is the first)
MEMBER_BITS = 2047  # ranks a group's membership can name (a subgroup's members from here on are unknown)
_SLOT = "QdBB6x32s200sQd256s"  # one thread's slot (see ProgressRecord)
_FIELDS = 9  # ...its fields, as unpacked


class ProgressRecord:
    """Where a rank is, readable by the kernel at any moment without the rank's help: a small shared file
    (mmap) that each collective updates on entry and exit. For hang diagnosis: which collective, its sequence
    number, since when, called from where, in which process group, at which DDP step, and when the rank last
    completed one.

    Layout (little-endian, 2,584 bytes): ``THREAD_SLOTS`` slots of 528 bytes, one per thread that calls
    collectives (the main thread's first; a thread takes a free one at its first collective, or the slot of
    a thread that has ended; more threads than slots share the last), so that a background thread's
    collectives never hide where the main thread waits. A slot: sequence number (u64, counted per thread),
    entered at (f64, monotonic), inside a collective (u8), waiting for its async work (u8: in ``Work.wait()``
    of collective #sequence, launched earlier with ``async_op=True``), 6 bytes of padding, operation (32
    bytes), call site (200 bytes), step (u64 at offset 256; DDP's iteration count for DDP's own collectives,
    else 0), progressed at (f64 at offset 264, monotonic; when the thread last left a collective, 0.0 before
    any), the collective's process group (256 bytes at 272: a bitmap of its global ranks below
    ``MEMBER_BITS``, the last bit set for any group but the default one; all zero: the default group).
    Then the DDP slot, which belongs to the main thread, for DDP's gradient all_reduce, the one collective a
    rank enters at every training step, written with as little as possible (two integers on entry, one on
    exit; no clock, no text): its step (u64), its sequence number times two plus one while inside (u64), the
    call site of its backward (200 bytes, written on the steps DDP's watch samples) and the model's process
    group (256 bytes, as in a slot, written when it changes). ``slots()`` gives every thread's place (the
    main thread's merged with the DDP slot: the innermost of the two), ``read()`` the rank's oldest
    unfinished wait. The DDP slot's "since" is 0.0 (unknown: the reader times it, ``HangWatch``).
    ``enter`` writes everything but "progressed at", ``leave`` only that and the "inside" byte.

    The rank's own side also adds up ``waited``, the seconds spent inside collectives (for the run's balance:
    who waits for whom), and calls ``on_due`` at the first ``leave`` after ``due`` (monotonic), so a meter can
    report a few times a minute without a thread or a clock read of its own.
    """

    _SLOT_LAYOUT = struct.Struct("<" + _SLOT)
    _LAYOUT = struct.Struct("<" + _SLOT * THREAD_SLOTS + "QQ200s256s")
    _ENTRY = struct.Struct("<QdBB6x32s200sQ")  # what enter() writes
    _WAIT = struct.Struct("<QdBB")  # a slot's sequence, entered at, inside, waiting for its async work
    _MEMBERS = struct.Struct("<256s")
    _MEMBERS_AT = 272
    _INSIDE = 16  # offset of the "inside" byte in a slot
    _PROGRESSED = struct.Struct("<d")
    _PROGRESSED_AT = _ENTRY.size
    _OFFSETS = tuple(range(0, _SLOT_LAYOUT.size * THREAD_SLOTS, _SLOT_LAYOUT.size))
    _DDP_SLOT = _SLOT_LAYOUT.size * THREAD_SLOTS  # the DDP slot: step, sequence * 2 + inside, its call site
    _DDP_SITE = struct.Struct("<200s")
    _DDP_MEMBERS = _DDP_SLOT + 216

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
        self._ddp_members = b""  # the group of the DDP slot's model, as last written
        self._sequences = [0] * THREAD_SLOTS  # per slot: the thread's collectives so far
        self._entered = [0.0] * THREAD_SLOTS
        self._members = [b""] * THREAD_SLOTS  # per slot: the group bitmap written last (written when it changes)
        self._owners: list = [None] * THREAD_SLOTS  # per slot past the first: the thread holding it
        self._local = threading.local()
        self._lock = threading.Lock()
        self.waited = 0.0
        self.due = float("inf")
        self.on_due = None

    @property
    def sequence(self) -> int:
        """The main thread's collectives so far."""
        return self._sequences[0]

    def slot(self) -> int:
        """The calling thread's slot (taken at its first collective)."""
        slot = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = self._take_slot()
        return slot

    def _take_slot(self) -> int:
        thread = threading.current_thread()
        if thread is threading.main_thread():
            return 0
        with self._lock:
            for slot in range(1, THREAD_SLOTS):
                owner = self._owners[slot]
                if owner is None or not owner.is_alive():
                    self._owners[slot] = thread
                    return slot
        return THREAD_SLOTS - 1  # more threads than slots: they share the last

    def enter(self, operation: str, call_site: str, step: int = 0, members: bytes = b"") -> int:
        """The calling thread enters collective ``operation`` (its number ``sequence + 1``) from ``call_site``,
        at DDP ``step``, in the process group whose ``members`` bitmap (``members_bitmap``) is given; returns
        the thread's slot, for ``leave``."""
        slot = getattr(self._local, "slot", None)
        if slot is None:
            slot = self.slot()
        sequence = self._sequences[slot] = self._sequences[slot] + 1
        self._write(slot, sequence, 0, operation, call_site, step, members)
        return slot

    def sequence_of(self, slot: int) -> int:
        """The number of the collective ``slot``'s thread entered last."""
        return self._sequences[slot]

    def enter_wait(self, sequence: int, operation: str, call_site: str, members: bytes = b"") -> int:
        """The calling thread waits (``Work.wait()``) for its collective #``sequence``, ``operation``, launched
        earlier with ``async_op=True``; returns its slot, for ``leave``."""
        slot = self.slot()
        self._write(slot, sequence, 1, operation, call_site, 0, members)
        return slot

    def _write(self, slot, sequence, waiting, operation, call_site, step, members) -> None:
        self._entered[slot] = now = time.monotonic()
        offset = self._OFFSETS[slot]
        if members is not self._members[slot]:
            self._MEMBERS.pack_into(self._map, offset + self._MEMBERS_AT, members)
            self._members[slot] = members
        self._ENTRY.pack_into(self._map, offset, sequence, now, 1, waiting, operation.encode()[:32],
                              call_site.encode("utf-8", "replace")[:200], step)

    def leave(self, waited: float | None = None, slot: int | None = None) -> None:
        """The collective completed: not inside any now, progress made at this moment. ``waited``: the seconds
        of it spent waiting for other ranks, when not all of it was (DDP's backward computes too). ``slot``:
        what ``enter`` returned (else the calling thread's)."""
        slot = self.slot() if slot is None else slot
        offset = self._OFFSETS[slot]
        now = time.monotonic()
        self._PROGRESSED.pack_into(self._map, offset + self._PROGRESSED_AT, now)
        self._map[offset + self._INSIDE] = 0
        self.waited += now - self._entered[slot] if waited is None else waited
        if now >= self.due:
            self.due = float("inf")
            try:
                self.on_due()
            except Exception:  # noqa: BLE001 - a report that failed must not fail the collective it rode on
                pass

    def leave_wait(self, slot: int, sequence: int) -> None:
        """The wait ``enter_wait`` recorded in ``slot`` for collective #``sequence`` has ended, if the slot
        still shows it (a thread that polled ``is_completed()`` may have entered other collectives since)."""
        recorded, _, inside, waiting = self._WAIT.unpack_from(self._map, slot * self._SLOT_LAYOUT.size)
        if inside and waiting and recorded == sequence:
            self.leave(slot=slot)

    def enter_ddp(self, step: int, members: bytes = b"") -> int:
        """Entering DDP's gradient all_reduce (the main thread's number ``sequence + 1``) at ``step``, on the
        process group of ``members``; what ``leave_ddp`` takes."""
        if members is not self._ddp_members:  # (a model's group: written once, not at every step)
            self._MEMBERS.pack_into(self._map, self._DDP_MEMBERS, members)
            self._ddp_members = members
        sequence = self._sequences[0] = self._sequences[0] + 1
        self._ddp[0] = step
        entered = self._ddp[1] = sequence * 2 + 1
        return entered

    def leave_ddp(self, entered: int) -> None:
        """DDP's gradient all_reduce that ``enter_ddp`` returned ``entered`` for has completed (the reader sees
        the progress; the time it waited is the balance meter's)."""
        self._ddp[1] = entered - 1

    def ddp_site(self, call_site: str) -> None:
        """The call site of DDP's backward (the user's ``loss.backward()``), when it is worth writing."""
        self._DDP_SITE.pack_into(self._map, self._DDP_SLOT + 16, call_site.encode("utf-8", "replace")[:200])

    def slots(self) -> list[dict]:
        """Each thread's place, the main thread's first (a collective it entered inside DDP's backward before
        DDP's own); slots no thread has used are left out, but the main thread's is always there. Keys:
        ``sequence``, ``since``, ``inside``, ``waiting_on_work``, ``operation``, ``call_site``, ``step``,
        ``progressed_at``, ``members`` (the group's bitmap; b"": every rank), ``slot``."""
        values = self._LAYOUT.unpack_from(self._map, 0)
        ddp_step, ddp, ddp_site, ddp_members = values[-4:]
        places = []
        for slot in range(THREAD_SLOTS):
            sequence, since, inside, waiting, operation, call_site, step, progressed_at, members = \
                values[slot * _FIELDS:(slot + 1) * _FIELDS]
            if slot and not sequence:
                continue
            if slot == 0 and not inside and (ddp % 2 or ddp // 2 > sequence):  # DDP's backward, or the last
                places.append({"sequence": ddp // 2, "since": 0.0, "inside": bool(ddp % 2), "waiting_on_work": False,
                               "operation": DDP_GRADIENTS, "call_site": ddp_site.rstrip(b"\0").decode(errors="replace"),
                               "step": ddp_step, "progressed_at": progressed_at, "members": ddp_members.rstrip(b"\0"),
                               "slot": 0})
                continue
            places.append({"sequence": sequence, "since": since, "inside": bool(inside),
                           "waiting_on_work": bool(waiting),
                           "operation": operation.rstrip(b"\0").decode(errors="replace"),
                           "call_site": call_site.rstrip(b"\0").decode(errors="replace"),
                           "step": step, "progressed_at": progressed_at, "members": members.rstrip(b"\0"),
                           "slot": slot})
        return places

    def read(self) -> dict:
        """The rank's oldest unfinished wait (a slot inside a collective; the DDP slot's, whose since is unknown,
        first), else the main thread's last collective: a dict with the keys of ``slots()``."""
        places = self.slots()
        return oldest_wait(places) or places[0]

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


def oldest_wait(places: list[dict]) -> dict | None:
    """Of a rank's places (``ProgressRecord.slots``), the one inside a collective for the longest, else None."""
    inside = [place for place in places if place["inside"]]
    return min(inside, key=lambda place: place["since"]) if inside else None


def members_bitmap(ranks) -> bytes:
    """A process group's global ``ranks`` as the record keeps them: bit r set for rank r below
    ``MEMBER_BITS``, and the last bit (a group, not the default one: b"")."""
    bitmap = bytearray(256)
    bitmap[-1] = 0x80
    for rank in ranks:
        if 0 <= rank < MEMBER_BITS:
            bitmap[rank // 8] |= 1 << (rank % 8)
    return bytes(bitmap)


def is_member(members: bytes, rank: int) -> bool:
    """Whether global ``rank`` belongs to the group of a record's ``members`` (b"": every rank). A subgroup's
    ranks from ``MEMBER_BITS`` on are unknown: not taken for members (no verdict rests on them)."""
    if not members:
        return True
    return rank // 8 < len(members) and bool(members[rank // 8] >> (rank % 8) & 1)
