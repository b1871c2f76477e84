"""A rank's result in memory the kernel maps: its bytes copied once, by the rank, and never through a pipe.

Before a rank starts, the kernel makes an empty in-memory file for it (``memfd_create``: a file with no name in
any folder, not /dev/shm) and names it to the rank as ``/proc/<kernel pid>/fd/<n>``, as it does the rank's
progress record. At its end the rank writes its result there (``write_result``: the pickle, then each storage at
the next multiple of ``ALIGN`` bytes), closes it and sends its ``result`` event with ``in_memory`` and no
attachment. The kernel seals the file's size, checks it against the layout the event's sizes give, and maps it
once: each storage of the value is a window of that mapping (``torch.frombuffer``, which keeps the mapping
alive), so the kernel holds the result once, in the pages the rank wrote. The memory is freed with the last
tensor of the result.

Why a file the kernel makes, named by /proc, rather than one the rank makes and passes over a socket, or one in
/dev/shm: the kernel holds it from before the rank starts to the end of the attempt, so a rank that has exited
by the time its event is read has taken nothing with it; and a memfd is gone with its last descriptor and its
last mapping, so nothing is left behind by a rank killed while writing, a failed run, or a kernel that dies
(a file in /dev/shm outlives them all unless someone unlinks it). Where the rank cannot write it (memory
refused, a file size limit), the result goes through the pipe as before and the event says why
(``memory_failed``).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os

ALIGN = 64  # each storage starts at a multiple of this in the file: aligned for any dtype and vector load
IN_MEMORY_FROM = 2**20  # smaller results (a loss, a few numbers) go through the pipe: a mapping is not worth it
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def layout(pickle_bytes: int, sizes: list) -> tuple[list, int]:
    """Where each storage starts in the file, and the file's size: the pickle at 0, then the storages."""
    offsets, end = [], pickle_bytes
    for size in sizes:
        start = -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + size
    return offsets, end


# -- worker side --------------------------------------------------------------------------------------------------
def write_result(path: str, parts: list) -> str:
    """The pickle and the storages (``parts``, as ``results.pack_result`` gives them) written into the kernel's file
    at ``path``; "" when done, else why not (the file is then emptied: the result goes through the pipe)."""
    offsets, size = layout(parts[0].nbytes, [part.nbytes for part in parts[1:]])
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        os.ftruncate(descriptor, size)
        for offset, part in zip([0, *offsets], parts):
            view, done = memoryview(part).cast("B"), 0
            while done < view.nbytes:
                done += os.pwrite(descriptor, view[done:], offset + done)
        return ""
    except OSError as exc:  # (a limit on file sizes: EFBIG; memory the system refuses: ENOSPC, ENOMEM)
        with contextlib.suppress(OSError):
            os.ftruncate(descriptor, 0)  # (its pages back to the system now, not at the attempt's end)
        return f"{type(exc).__name__}: {exc}"
    finally:
        os.close(descriptor)


# -- kernel side --------------------------------------------------------------------------------------------------
class ResultFiles:
    """The kernel's in-memory files of one attempt, one per rank that may send a result (``path_for``), until
    each is taken with its rank's result (``take``) or the attempt ends (``close``)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._files: dict[int, int] = {}

    def path_for(self, rank: int) -> str:
        """The path ``rank`` writes its result to, or "" (results through the pipe) where none can be made."""
        if not self.enabled:
            return ""
        try:
            descriptor = os.memfd_create(f"notebook-launcher-result-{os.getpid()}-{rank}",
                                         os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except (OSError, AttributeError):
            return ""
        self._files[rank] = descriptor
        return f"/proc/{os.getpid()}/fd/{descriptor}"

    def take(self, rank: int) -> MappedResult:
        """``rank``'s file, now that its ``result`` event says the result is in it (ours to close from now on)."""
        return MappedResult(self._files.pop(rank, -1))

    def close(self) -> None:
        for descriptor in self._files.values():
            os.close(descriptor)
        self._files.clear()


class MappedResult:
    """A ``result`` event's attachment when the rank wrote it in memory: the file, mapped by ``read``."""

    def __init__(self, descriptor: int):
        self._descriptor = descriptor

    def __len__(self) -> int:  # (the run log counts attachments by their length: this one has no bytes on the pipe)
        return 0

    def read(self, pickle_bytes: int, sizes: list) -> tuple[bytes, list]:
        """The pickle and a storage for each of ``sizes``, windows of one mapping of the file. The sizes are the
        rank's word: the file's own size, sealed first so the rank cannot shrink it under the mapping (a SIGBUS
        here), must be what they lay out, to the byte."""
        import torch

        descriptor, self._descriptor = self._descriptor, -1
        if descriptor < 0:
            raise ValueError("the rank says its result is in memory, but it was given none")
        try:
            fcntl.fcntl(descriptor, fcntl.F_ADD_SEALS, _SEALS)
            offsets, size = layout(pickle_bytes, sizes)
            held = os.fstat(descriptor).st_size
            if held != size or size == 0:
                raise ValueError(f"the rank's result in memory is {held} bytes, not the {size} its sizes lay out")
            mapped = _Mapping(descriptor, size)
        finally:
            os.close(descriptor)
        storages = [torch.frombuffer(mapped.window(offset, count), dtype=torch.uint8).untyped_storage()
                    for offset, count in zip(offsets, sizes)]
        return bytes(mapped.window(0, pickle_bytes)), storages

    def close(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1

    __del__ = close


class _Mapping:
    """One shared mapping of a file, unmapped when the last of its windows is collected. (Python's own ``mmap``
    keeps a duplicate of the file's descriptor open as long as it lives: one more open file per result kept.)"""

    _libc = None

    def __init__(self, descriptor: int, size: int):
        libc = _Mapping._libc
        if libc is None:
            libc = _Mapping._libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.size = 0
        address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, descriptor, 0)
        if address is None or address == ctypes.c_void_p(-1).value:
            error = ctypes.get_errno()
            raise OSError(error, f"mapping a result of {size} bytes: {os.strerror(error)}")
        self.address, self.size = address, size

    def window(self, offset: int, count: int) -> memoryview:
        """``count`` bytes at ``offset``, writable, keeping this mapping alive as long as they are."""
        window = (ctypes.c_ubyte * count).from_address(self.address + offset)
        window.mapping = self
        return memoryview(window).cast("B")

    def __del__(self):
        if self.size:
            self._libc.munmap(self.address, self.size)
