"""A rank's result storages moved, in place, onto the pages of the in-memory file they were just written to.

Once a storage's bytes are in the kernel's file, the rank's own copy of them is a second copy, freed only when the
rank lets go of the value: milliseconds per 64 MB, after the result is written, on the way to the rank's end (and
the rank holds its result twice until then). Instead, as soon as a storage is written, its whole pages are mapped
over with the file's pages that now hold the same bytes (``mmap`` with ``MAP_FIXED``), privately
(``MAP_PRIVATE``): the rank reads the same bytes at the same addresses, so every tensor, view or numpy array over
them stays what it was; a write by the rank after that (an exit handler, or the allocator's own bookkeeping once the
tensor is freed) lands in a private copy of that page and never reaches the kernel's. The pages the mapping
replaces are freed there and then, while the next storage is written.

For that, a storage's place in the file has the same offset within a page as its address (``phases``: the layout
pads to it), so that its whole pages line up with whole pages of the file.

Only memory the rank has to itself is moved: a private anonymous mapping (the heap, the allocator's own mappings)
as /proc/self/maps says, not shared memory, not a file, not host memory pinned for a GPU; only where ``malloc`` is
the C library's (``glibc_malloc``); only a storage of ``MOVE_FROM`` bytes or more, and only its whole pages; and
only as many as the mappings the process may still make allow (a move can split a mapping in three). A move that
cannot be made is not made: the bytes are in the file either way. A file a storage is moved onto is sealed
against shrinking first: cut short, it would take the rank's memory with it.
"""

from __future__ import annotations

import bisect
import ctypes
import fcntl
import mmap
import os
import sys
import threading

MOVE_FROM = 256 * 2**10  # a smaller storage: freeing its pages costs less than the mapping that replaces them
_MAPPINGS_SPARED = 1024  # mappings left to the rest of the rank's life, whatever the moves take
FIXED = 0x10  # MAP_FIXED (Linux's value; Python's mmap module does not name it)
_MS_ASYNC = 1  # (nor this one, msync's)

_libc = None


def libc():
    """The C library, with ``mmap`` and ``munmap`` typed for addresses."""
    global _libc
    if _libc is None:
        loaded = ctypes.CDLL(None, use_errno=True)
        loaded.mmap.restype = ctypes.c_void_p
        loaded.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                ctypes.c_long]
        loaded.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        loaded.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc = loaded
    return _libc


def phases(addresses: list, sizes: list, align: int) -> list:
    """For each storage, the offset within a page that its place in the file must have (its address's), or -1
    where it will not be moved (any place aligned to ``align`` will do): one too small, one not itself aligned to
    ``align`` (its place in the file would not be either), or any where ``malloc`` is not the C library's."""
    if not glibc_malloc():
        return [-1] * len(addresses)
    return [address % mmap.PAGESIZE if size >= MOVE_FROM and address % align == 0 else -1
            for address, size in zip(addresses, sizes)]


class PageMover:
    """Moves the written parts of storages onto their file's pages (``move``), for a rank writing its result; its
    view of the rank's mappings is read at the first move (by a writing thread, while the others write)."""

    def __init__(self):
        self.moved: set = set()  # the files some storage now lives on (they must keep their pages)
        self._lock = threading.Lock()
        self._starts: list | None = None
        self._ends: list = []
        self._left = 0

    def move(self, address: int, length: int, descriptor: int, file_offset: int, owner=None) -> None:
        """The whole pages of the ``length`` bytes at ``address``, just written at ``file_offset`` of the file
        ``descriptor``, mapped over with the file's pages, where they are private anonymous memory and not pinned
        for a GPU (which copies into those pages, not into the file's). ``owner``: what holds the bytes (a view
        whose ``owner`` is the storage)."""
        page = mmap.PAGESIZE
        first = -(-address // page) * page
        last = (address + length) // page * page
        where = file_offset + first - address
        if last - first < page or where % page:
            return
        with self._lock:
            if self._starts is None:
                self._read_mappings()
            at = bisect.bisect_right(self._starts, first) - 1
            if self._left <= 0 or at < 0 or last > self._ends[at] or _pinned(getattr(owner, "owner", None)):
                return
            if descriptor not in self.moved:
                try:  # (a page of a file cut short under a mapping is a SIGBUS: this rank's memory now)
                    fcntl.fcntl(descriptor, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
                except OSError:
                    return
            self._left -= 1
            self.moved.add(descriptor)
        protection, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | FIXED
        if libc().mmap(first, last - first, protection, flags, descriptor, where) != first:
            with self._lock:
                self._left = 0  # (whatever refused this one would refuse the next: the rest stay as they are)
            _mend(first, last - first, descriptor, where)

    def _read_mappings(self) -> None:
        """The private anonymous ranges of this process (/proc/self/maps), and how many moves the mappings it
        may still make allow."""
        self._starts = []
        try:
            with open("/proc/self/maps", "rb") as maps:
                lines = maps.read().splitlines()
            with open("/proc/sys/vm/max_map_count") as limit:
                self._left = (int(limit.read()) - len(lines) - _MAPPINGS_SPARED) // 2
        except (OSError, ValueError):
            return
        for line in lines:  # "start-end perms offset dev inode [path]"
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) > 5 else b""
            anonymous = fields[4] == b"0" and (path in (b"", b"[heap]") or path.startswith(b"[anon:"))
            if fields[1] != b"rw-p" or not anonymous:
                continue
            start, end = (int(bound, 16) for bound in fields[0].split(b"-"))
            if self._ends and self._ends[-1] == start:
                self._ends[-1] = end  # (side by side: one private range)
            else:
                self._starts.append(start)
                self._ends.append(end)


def _mend(address: int, length: int, descriptor: int, where: int) -> None:
    """After a refused ``MAP_FIXED``, which may have taken the old pages away before it failed (the kernel unmaps
    first): if any page of the range is gone, the range mapped again as anonymous memory and its bytes read back
    from the file, which holds them."""
    if libc().msync(address, length, _MS_ASYNC) == 0:
        return  # (every page still mapped: the storage is where it was)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | FIXED
    if libc().mmap(address, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0) == address:
        os.preadv(descriptor, [(ctypes.c_char * length).from_address(address)], where)


def glibc_malloc() -> bool:
    """Whether this process's ``malloc`` is the C library's own. Another allocator (jemalloc, tcmalloc, often
    preloaded beside PyTorch) may take memory it gave back with ``MADV_DONTNEED`` to read as zeros, which a page
    of a file does not: nothing is moved then."""
    global _glibc_malloc
    if _glibc_malloc is None:
        try:
            ours = ctypes.cast(libc().malloc, ctypes.c_void_p).value
            _glibc_malloc = ours == ctypes.cast(ctypes.CDLL("libc.so.6").malloc, ctypes.c_void_p).value
        except (OSError, AttributeError):
            _glibc_malloc = False
    return _glibc_malloc


_glibc_malloc = None


def _pinned(storage) -> bool:
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    return storage is not None and cuda is not None and cuda.is_initialized() and storage.is_pinned()
