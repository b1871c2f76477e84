"""A worker's ``sys.stdout``/``sys.stderr`` and its ``print``: text from Python goes to the kernel as events.

Worker side only (it knows the event schema, nothing of the kernel).
"""

from __future__ import annotations

import functools
import io
import sys

from ..schema.events import EventWriter, write_all

_OUTPUT_EVENT_CHARS = 1 << 20  # a longer write travels as several events (the kernel joins them into lines)


class FdTextStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a worker: every write goes to the kernel at once, no buffer.

    Text written from Python travels as ``output`` events on the rank's event channel, so prints and log
    records keep their order; C/C++ output reaches the same place through fd 1/2. No buffer means no loss: a
    line printed just before a SIGKILL is already in the kernel's pipe.
    """

    def __init__(self, fd: int, name: str, channel: EventWriter | None = None):
        super().__init__()
        self._fd = fd
        self._name = name
        self._channel = channel
        self._stream = 1 if fd == 2 else 0  # (events.TEXT_STREAMS)
        self.buffer = _FdBinaryStream(fd)

    @property
    def name(self) -> str:
        return self._name

    @property
    def encoding(self) -> str:
        return "utf-8"

    @property
    def errors(self) -> str:
        return "backslashreplace"

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._channel is not None:
            for start in range(0, len(text), _OUTPUT_EVENT_CHARS):  # one event for any ordinary write
                self._channel.emit_text(self._stream, text[start:start + _OUTPUT_EVENT_CHARS])
        else:
            write_all(self._fd, text.encode("utf-8", "backslashreplace"))
        return len(text)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False

    def flush(self) -> None:
        pass


class _FdBinaryStream(io.RawIOBase):
    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd

    def write(self, data) -> int:
        data = bytes(data)
        write_all(self._fd, data)
        return len(data)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd


def one_write_print(original):
    """``print`` that hands a line to our streams in one write (Python's writes the text and the newline
    separately: two events, two pipe writes, two frames for the kernel to read). Anything else: the original."""
    @functools.wraps(original)
    def print(*values, sep=" ", end="\n", file=None, flush=False):  # noqa: A001 - it is print
        target = sys.stdout if file is None else file
        if type(target) is not FdTextStream or type(sep) is not str or type(end) is not str:
            return original(*values, sep=sep, end=end, file=file, flush=flush)
        target.write(sep.join([value if type(value) is str else str(value) for value in values]) + end)
        return None

    return print
