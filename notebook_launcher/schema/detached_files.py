"""A detached run's files in its run folder, and the messages on its socket: what its supervisor process writes
and what any kernel of the same user reads to attach (``launchers/detached_supervisor.py`` writes,
``detached.py`` reads). Every file and the socket are the owner's only (the folder is 0700).

- ``supervisor.json``: the supervisor's pid and start time (so a reused pid is not taken for it), and what the
  panel needs to draw the run (ids, device, ranks);
- ``supervisor.sock``: the live channel, while the run goes on (removed at its end);
- ``outcome.json``: how it ended (status, the error's type and message, the panel's failure card), written last;
  ``status: "lost"`` when a reader found the supervisor gone without one;
- ``result.json`` + ``result.bin``: rank 0's return value as ``results.pack_result`` packs it.

A message is ``[u32 header length][u32 attachment length]`` then the header (JSON) and the attachment.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import struct

SUPERVISOR = "supervisor.json"
SOCKET = "supervisor.sock"
OUTCOME = "outcome.json"
RESULT_HEADER = "result.json"
RESULT = "result.bin"
LOST = "lost"
_FRAME = struct.Struct(">II")
MAX_HEADER = 64 * 2**20


def message(header: dict, attachment: bytes = b"") -> bytes:
    body = json.dumps(header, default=str).encode()
    return _FRAME.pack(len(body), len(attachment)) + body + attachment


class MessageReader:
    """Whole messages out of the bytes received: ``feed`` them, then iterate ``(header, attachment)``."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list:
        self._buffer += data
        out = []
        while len(self._buffer) >= _FRAME.size:
            size, extra = _FRAME.unpack_from(self._buffer)
            if size > MAX_HEADER:
                raise ValueError(f"a message header of {size} bytes on a run's socket: not a supervisor's")
            end = _FRAME.size + size + extra
            if len(self._buffer) < end:
                break
            header = json.loads(bytes(self._buffer[_FRAME.size:_FRAME.size + size]))
            out.append((header, bytes(self._buffer[_FRAME.size + size:end])))
            del self._buffer[:end]
        return out


def socket_address(folder_fd: int) -> str:
    """The socket's path through the folder's descriptor: a run folder's own path may be longer than the 107
    bytes a Unix socket's address holds."""
    return f"/proc/self/fd/{folder_fd}/{SOCKET}"


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc), which a reused pid does not share; None if it
    is gone (a zombie included: it has ended, only its parent has not reaped it yet; if that parent is this process,
    as for a supervisor re-parented to a kernel that was a subreaper then, it is reaped here)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    if len(fields) >= 2 and fields[0] == b"Z" and fields[1] == str(os.getpid()).encode():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return None if len(fields) < 20 or fields[0] in (b"Z", b"X") else fields[19].decode()


def write_private(folder: str, name: str, data: bytes) -> None:
    """``folder/name``, owner-only, written whole or not at all (a temporary file renamed)."""
    temporary = os.path.join(folder, f".{name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, os.path.join(folder, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def read_json(folder: str, name: str) -> dict | None:
    """``folder/name`` as JSON (None if absent); a file that is not a private regular one of this user, or not a
    JSON object, raises ValueError saying so."""
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{path} cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(source.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise ValueError(f"{path} is not a private file of this user")
        try:
            value = json.loads(source.read(MAX_HEADER))
        except ValueError:
            raise ValueError(f"{path} is not JSON (a damaged file)") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a JSON object (a damaged file)")
    return value


def peer_uid(connection: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (SO_PEERCRED: pid, uid, gid)."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]
