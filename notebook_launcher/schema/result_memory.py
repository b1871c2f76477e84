"""A rank's result in memory the kernel maps: its bytes copied once, by the rank, and never through a pipe.

Before a rank starts, the kernel makes empty in-memory files for it (``memfd_create``: files with no name in any
folder, not /dev/shm) and names them to the rank as ``/proc/<kernel pid>/fd/<n>``, as it does the rank's
progress record. At its end the rank lays its result out (``layout``: the pickle, then each storage at the next
multiple of ``ALIGN`` bytes, or at the offset within a page its ``phase`` gives), cuts that layout into contiguous
pieces (``pieces``), writes each piece into its own file from a thread of its own (``write_result``), and sends its
``result`` event with ``in_memory`` and no attachment. The kernel seals each file's size, checks it against the
piece the event's sizes give, and maps the files side by side into one range of its address space: the layout as
the rank made it, each storage of the value a window of it (``torch.frombuffer``, which keeps the mapping alive).
The kernel holds the result once, in the pages the rank wrote; they are freed with the last tensor of the result.
Each storage, once written, is moved onto those pages in the rank too (``page_move.py``): the rank then holds it
once as well, and does not free it on its way out.

Why several files: a new page costs more than the bytes copied into it, and the pages of one file are made one
writer at a time (the file's lock), so a large result is written by as many threads as the machine has cores
for it (``files_for``), each into a file of its own.

Why files the kernel makes, named by /proc, rather than ones the rank makes and passes over a socket, or ones in
/dev/shm: the kernel holds them from before the rank starts to the end of the attempt, so a rank that has exited
by the time its event is read has taken nothing with it; and a memfd is gone with its last descriptor and its
last mapping, so nothing is left behind by a rank killed while writing, a failed run, or a kernel that dies
(a file in /dev/shm outlives them all unless someone unlinks it). Where the rank cannot write them (memory
refused, a file size limit) or the kernel could not make them, the result goes through the pipe as before and
the event says why (``memory_failed``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
from concurrent.futures import ThreadPoolExecutor

from . import page_move

ALIGN = 64  # each storage starts at a multiple of this in the layout: aligned for any dtype and vector load
IN_MEMORY_FROM = 2**20  # smaller results (a loss, a few numbers) go through the pipe: a mapping is not worth it
PIECE_FROM = 32 * 2**20  # a piece of a result written by a thread of its own holds at least this much
MOST_FILES = 4  # a rank's writers (beyond this the copy is bound by memory, not by the cores making pages)
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def layout(pickle_bytes: int, sizes: list, phases: list | None = None) -> tuple[list, int]:
    """Where each storage starts in the layout, and its size: the pickle at 0, then the storages, each at the next
    multiple of ``ALIGN`` or, where ``phases`` gives it one from 0, at the next offset with that remainder in a
    page (``page_move.py``)."""
    offsets, end, page = [], pickle_bytes, mmap.PAGESIZE
    for index, size in enumerate(sizes):
        phase = phases[index] if phases else -1
        start = end + (phase - end) % page if phase >= 0 else -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + size
    return offsets, end


def pieces(size: int, files: int) -> list[tuple[int, int]]:
    """(start, length) of each piece of a layout of ``size`` bytes cut for up to ``files`` files: contiguous, each
    but the last a whole number of pages (so that the kernel can map the files side by side), none smaller than
    ``PIECE_FROM`` unless the result is."""
    wanted = max(1, min(files, size // PIECE_FROM))
    page = mmap.PAGESIZE
    each = max(page, -(-size // wanted // page) * page)
    return [(start, min(each, size - start)) for start in range(0, size, each)] or [(0, 0)]


def files_for(senders: int) -> int:
    """How many files (and writing threads) each of ``senders`` ranks gets: the cores this process may use,
    shared among the ranks that send a result at the same time, at most ``MOST_FILES``."""
    return max(1, min(MOST_FILES, len(os.sched_getaffinity(0)) // max(1, senders)))


# -- worker side --------------------------------------------------------------------------------------------------
def write_result(paths: list, parts: list) -> tuple[str, list]:
    """The pickle and the storages (``parts``, as ``results.pack_result`` gives them) written into the kernel's
    files at ``paths``, a piece each, in parallel, each storage then moved onto the file's pages where it can be
    (``page_move.py``). Returns "" when done, else why not (the files are then emptied, unless a storage now lives
    on them: the result goes through the pipe); and the storages' ``phases`` (the event's, for the layout)."""
    storages = parts[1:]
    addresses = [ctypes.addressof(ctypes.c_char.from_buffer(part)) for part in storages]
    sizes = [part.nbytes for part in storages]
    phases = page_move.phases(addresses, sizes, ALIGN)
    offsets, size = layout(parts[0].nbytes, sizes, phases)
    cuts = pieces(size, len(paths))
    mover = page_move.PageMover() if max(phases, default=-1) >= 0 else None
    spans = [(0, memoryview(parts[0]).cast("B"), None)]
    spans += [(offset, memoryview(part).cast("B"), address if phase >= 0 else None)
              for offset, part, address, phase in zip(offsets, storages, addresses, phases)]
    descriptors: list[int] = []
    try:
        for path in paths[:len(cuts)]:
            descriptors.append(os.open(path, os.O_RDWR | os.O_CLOEXEC))
        for descriptor, (_, length) in zip(descriptors, cuts):
            os.ftruncate(descriptor, length)
        _write_pieces(descriptors, cuts, spans, mover)
        return "", phases
    except Exception as exc:  # noqa: BLE001 - (a limit on file sizes: EFBIG; memory refused: ENOSPC, ENOMEM)
        for descriptor in descriptors:
            if mover is None or descriptor not in mover.moved:  # (a moved storage reads its bytes from its file)
                with contextlib.suppress(OSError):
                    os.ftruncate(descriptor, 0)  # (their pages back to the system now, not at the attempt's end)
        return f"{type(exc).__name__}: {exc}", phases
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


def _write_pieces(descriptors: list, cuts: list, spans: list, mover) -> None:
    """Each piece into its file at the same time: the first from this thread, each other from a thread of its own
    (``os.pwrite`` lets go of the GIL: the threads make their files' pages at the same time); one after another
    where no thread can start (a rank at its ``memory_limit`` has no address space left for a thread's stack, and
    needs none to write)."""
    pool, writing = None, []
    if len(cuts) > 1:
        try:
            pool = ThreadPoolExecutor(len(cuts) - 1, thread_name_prefix="result-writer")
            writing = [pool.submit(_write_piece, descriptor, *cut, spans, mover)
                       for descriptor, cut in zip(descriptors[1:], cuts[1:])]
        except RuntimeError:  # ("can't start new thread")
            pool.shutdown(wait=True)  # (the pieces it took are written once more below: the same bytes)
            pool, writing = None, []
    try:
        _write_piece(descriptors[0], *cuts[0], spans, mover)
    finally:
        if pool is not None:
            with pool:
                for done in writing:
                    done.result()
    if pool is None:
        for descriptor, cut in zip(descriptors[1:], cuts[1:]):
            _write_piece(descriptor, *cut, spans, mover)


def _write_piece(descriptor: int, start: int, length: int, spans: list, mover) -> None:
    """The bytes of the layout from ``start`` to ``start + length`` (of the pickle and storages in ``spans``, each
    with its offset in the layout and, if it may be moved, its address), at offset 0 on in the piece's file; each
    storage's part moved onto the file's pages once written."""
    end = start + length
    for offset, view, address in spans:
        low, high = max(offset, start), min(offset + view.nbytes, end)
        first = low
        while low < high:
            low += os.pwrite(descriptor, view[low - offset:high - offset], low - start)
        if address is not None and first < high:
            mover.move(address + first - offset, high - first, descriptor, first - start, view.obj)


# -- kernel side --------------------------------------------------------------------------------------------------
class ResultFiles:
    """The kernel's in-memory files of one attempt, for each rank that may send a result (``paths_for``),
    until they are taken with their rank's result (``take``) or the attempt ends (``close``). ``failed``: why
    the kernel could make none (its results then come through the pipes, and the run says so once)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.failed = ""
        self._files: dict[int, list] = {}

    def paths_for(self, rank: int, files: int = 1) -> list:
        """The ``files`` paths ``rank`` writes its result to, or [] (results through the pipe) where none can be
        made."""
        if not self.enabled or self.failed:
            return []
        made: list[int] = []
        try:
            for piece in range(files):
                made.append(os.memfd_create(f"notebook-launcher-result-{os.getpid()}-{rank}-{piece}",
                                            os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
        except OSError as exc:
            for descriptor in made:
                os.close(descriptor)
            self.failed = f"{type(exc).__name__}: {exc}"
            return []
        self._files[rank] = made
        return [f"/proc/{os.getpid()}/fd/{descriptor}" for descriptor in made]

    def take(self, rank: int) -> MappedResult:
        """``rank``'s files, now that its ``result`` event says the result is in them (ours to close from now on)."""
        return MappedResult(self._files.pop(rank, []))

    def close(self) -> None:
        for descriptors in self._files.values():
            for descriptor in descriptors:
                os.close(descriptor)
        self._files.clear()


class MappedResult:
    """A ``result`` event's attachment when the rank wrote it in memory: the files, mapped by ``read``."""

    def __init__(self, descriptors: list):
        self._descriptors = list(descriptors)

    def __len__(self) -> int:  # (the run log counts attachments by their length: this one has no bytes on the pipe)
        return 0

    def read(self, pickle_bytes: int, sizes: list, phases: list | None = None) -> tuple[bytes, list]:
        """The pickle and a storage for each of ``sizes``, windows of one mapping of the files. The sizes are the
        rank's word: each file's own size, sealed first so the rank cannot shrink it under the mapping (a SIGBUS
        here), must be its piece of what they lay out, to the byte."""
        import torch

        descriptors, self._descriptors = self._descriptors, []
        if not descriptors:
            raise ValueError("the rank says its result is in memory, but it was given none")
        try:
            for descriptor in descriptors:
                fcntl.fcntl(descriptor, fcntl.F_ADD_SEALS, _SEALS)
            offsets, size = layout(pickle_bytes, sizes, phases)
            cuts = pieces(size, len(descriptors))
            stats = [os.fstat(descriptor) for descriptor in descriptors]
            held = [stat.st_size for stat in stats]
            if held != [length for _, length in cuts] + [0] * (len(held) - len(cuts)) or size == 0:
                raise ValueError(f"the rank's result in memory is {sum(held)} bytes (files of {held}), not the "
                                 f"{size} its sizes lay out")
            if any(stat.st_blocks * 512 < stat.st_size for stat in stats):  # (holes: sizes claimed, never written)
                raise ValueError(f"the rank's result in memory claims {size} bytes, but its files hold only "
                                 f"{sum(min(stat.st_blocks * 512, stat.st_size) for stat in stats)} of them")
            mapped = _Mapping(descriptors[:len(cuts)], cuts, size)
        finally:
            for descriptor in descriptors:
                os.close(descriptor)
        storages = [torch.frombuffer(mapped.window(offset, count), dtype=torch.uint8).untyped_storage()
                    for offset, count in zip(offsets, sizes)]
        return bytes(mapped.window(0, pickle_bytes)), storages

    def close(self) -> None:
        for descriptor in self._descriptors:
            os.close(descriptor)
        self._descriptors = []

    __del__ = close


class _Mapping:
    """Files mapped side by side into one range of addresses, unmapped when the last of its windows is collected.
    (Python's own ``mmap`` maps one file and keeps a duplicate of its descriptor open as long as it lives.)"""

    def __init__(self, descriptors: list, cuts: list, size: int):
        self._libc = page_move.libc()
        self.size = 0
        whole = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        # the range first, reserved (no access, no memory), then each file over its part of it
        address = self._map(None, whole, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE, -1)
        self.address, self.size = address, whole
        for descriptor, (start, length) in zip(descriptors, cuts):
            self._map(address + start, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _FIXED,
                      descriptor)

    def _map(self, where, length: int, protection: int, flags: int, descriptor: int) -> int:
        address = self._libc.mmap(where, length, protection, flags, descriptor, 0)
        if address is None or address == ctypes.c_void_p(-1).value:
            error = ctypes.get_errno()
            raise OSError(error, f"mapping a result of {length} bytes: {os.strerror(error)}")
        return address

    def window(self, offset: int, count: int) -> memoryview:
        """``count`` bytes at ``offset``, writable, keeping this mapping alive as long as they are."""
        window = (ctypes.c_ubyte * count).from_address(self.address + offset)
        window.mapping = self
        return memoryview(window).cast("B")

    def __del__(self):
        if self.size:
            self._libc.munmap(self.address, self.size)


_PROT_NONE = 0  # (Linux's value; Python's mmap module names it from 3.13)
_FIXED = page_move.FIXED
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
