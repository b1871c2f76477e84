"""The event schema: the only thing worker-side and kernel-side code share.

A worker writes small typed records into a pipe of its own; the kernel reads them. Each record is one frame::

    [u32 header length][u32 attachment length][header: marshal][attachment: bytes]

The header is the event (rank, per-rank sequence number, monotonic time, kind, data) as plain Python data
(dicts, lists, str, int, float, bool, None) in ``marshal`` format: five times cheaper to write than JSON (it
matters at one record per log call), and unlike pickle it cannot run code when read. Both ends are the same
interpreter (fork, or spawn with ``sys.executable``). The run log on disk is JSON lines. The optional binary
attachment carries a pickled return value. A frame is written with as few ``os.write`` calls as
the kernel's pipe allows, from one buffer, so whatever a worker wrote before it died (even by SIGKILL) is complete
in the pipe for the kernel to read. A partial frame at EOF (a worker killed in the middle of a large write) is
reported by the reader, not silently dropped.

A worker's ``output`` is sent as a *text frame*, whose header is only the tuple ``(0 | 1, text)``
(``TEXT_STREAMS``: stdout, stderr), without rank, seq, time or kind (``EventWriter.emit_text``); likewise a
``log`` record of ``get_logger`` (without exc_text, stack or in_order) as a *record frame*, ``(LOG_FRAME, time,
level, levelno, logger, message, file, line, function, created, seq)``: its data's values in ``RECORD_KEYS``'
order, without the keys (``emit_record``).

The kinds of events, each one's data and the table the kernel checks it against, are declared once, in
``kinds.KINDS`` (re-exported here: the kinds' names, ``DATA_SCHEMA``, ``KERNEL_ONLY_KINDS``).
"""

from __future__ import annotations

import marshal
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .kinds import (  # noqa: F401 (the kinds' names and tables, read from here)
    AGENT_EVENT,
    BALANCE,
    BATCH_SIZE,
    DATA_SCHEMA,
    DISPLAY,
    EXIT,
    FAILURE,
    HANG_NOTICE,
    KERNEL_ONLY_KINDS,
    LAUNCHER,
    LOG,
    NODE_ERROR_EVENT,
    NOTE_EVENT,
    NUMBER,
    OOM_REPORT,
    OOM_RETRY,
    OUTPUT,
    PROGRESS,
    RESTART,
    RESULT,
    SHAPE_MISMATCH,
    STATUS,
    STREAM,
    TEXT_ESCAPED,
    TEXT_STREAMS,
    TRIGGER,
    Fields,
    ListOf,
    MapOf,
    OneOf,
)
from .wiretext import MAYBE_SURROGATE as _MAYBE_SURROGATE
from .wiretext import escaped as _escaped

SCHEMA_VERSION = 1
TRUE_VALUES = ("1", "true", "yes", "on", "y", "t")  # how Accelerate reads a flag such as ACCELERATE_DEBUG_MODE
FRAME_HEADER = struct.Struct(">II")
MARSHAL_VERSION = 2  # no back-references: a fifth faster to read than the default (4), the same to write

# compact frames, whose header is a tuple: (0 | 1, text) is an ``output`` event (its stream: TEXT_STREAMS[0 | 1]),
# (LOG_FRAME, time, *values) a ``log`` event (the rank is the pipe's; the kernel numbers every event and times text)
LOG_FRAME = 2
# a get_logger record's data, in this order (worker_seq: the rank's own count, which the kernel adds to every event)
RECORD_KEYS = ("level", "levelno", "logger", "message", "file", "line", "function", "created", "worker_seq")
RECORD_TYPES = (str, int, str, str, str, int, str, float, int)
# a record frame is a plain tuple (no object per record on the hot path): its fields by position, read by name
RECORD_FRAME_FIELDS = ("frame", "time", *RECORD_KEYS)
RECORD_FRAME_TYPES = (int, float, *RECORD_TYPES)
RECORD_TIME, RECORD_LEVEL, RECORD_LOGGER, RECORD_MESSAGE = (
    RECORD_FRAME_FIELDS.index(name) for name in ("time", "level", "logger", "message"))
RECORD_DATA = slice(RECORD_FRAME_FIELDS.index("level"), None)  # the values of RECORD_KEYS
# a text frame: (TEXT_STREAMS' index, text)
TEXT_FRAME_STREAM, TEXT_FRAME_TEXT = 0, 1

TRUNCATED_EVENT = "TruncatedEvent"  # a failure the kernel makes: an event cut short by the worker's death
CORRUPT_EVENT_STREAM = "CorruptEventStream"  # a failure the kernel makes: bytes on an event pipe that are no event

@dataclass
class Event:
    """One record of what a rank did. ``seq`` orders the events of one rank as the kernel received them."""

    rank: int
    seq: int
    time: float
    kind: str
    data: dict = field(default_factory=dict)
    attachment: Any = b""  # bytes, or the buffers a result was read into (results.ResultParts)

    def to_json(self) -> dict:
        """The event as written to the run log (attachments are summarised by their size)."""
        record = {"rank": self.rank, "seq": self.seq, "time": self.time, "kind": self.kind, "data": self.data}
        if self.attachment:
            record["attachment_bytes"] = len(self.attachment)
        return record


def encode_frame(rank: int, seq: int, kind: str, data: dict, attachment: bytes = b"",
                 when: float | None = None) -> bytes:
    """One frame, ready for a single write."""
    header = marshal.dumps(
        {"v": SCHEMA_VERSION, "rank": rank, "seq": seq, "time": time.monotonic() if when is None else when,
         "kind": kind, "data": data}, MARSHAL_VERSION)
    return FRAME_HEADER.pack(len(header), len(attachment)) + header + attachment


def write_all(fd: int, payload: bytes) -> None:
    """Write every byte (a pipe write may be partial when it is large or interrupted)."""
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


_PIPE_BUF = 4096  # writes up to this size are atomic on a pipe, whoever else writes to it


class EventWriter:
    """The worker's end of its event pipe. One lock-protected write per event; no thread, no round trip.

    A process forked from the worker (a DataLoader worker) inherits the writer and shares the pipe: there each
    frame is cut to one atomic pipe write, so it can never interleave with the rank's own frames, and the lock
    is made anew (it may have been held by another thread at the moment of the fork).
    """

    def __init__(self, fd: int, rank: int):
        self.fd = fd
        self.rank = rank
        self._seq = 0
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()
        self.escaped = False  # a text_escaped event was sent (wire_text)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def emit(self, kind: str, data: dict | None = None, attachment: bytes = b"") -> None:
        with self._lock:  # (encode_frame, inlined: this runs once per log line and print)
            self._seq = seq = self._seq + 1
            data = data or {}
            header = marshal.dumps({"v": SCHEMA_VERSION, "rank": self.rank, "seq": seq, "time": time.monotonic(),
                                    "kind": kind, "data": data}, MARSHAL_VERSION)
            safe = _escaped(data, header) if _MAYBE_SURROGATE in header else None
            if safe is not None:
                data = safe
                header = marshal.dumps({"v": SCHEMA_VERSION, "rank": self.rank, "seq": seq,
                                        "time": time.monotonic(), "kind": kind, "data": data}, MARSHAL_VERSION)
            frame = FRAME_HEADER.pack(len(header), len(attachment)) + header
            if attachment:
                frame += attachment
            if len(frame) > _PIPE_BUF and os.getpid() != self._owner_pid:
                frame = _shrink_to_pipe_buf(self.rank, seq, kind, data)
            self._write(frame)
            if safe is not None:
                self._say_escaped(kind)

    def emit_record(self, values: tuple) -> None:
        """A ``log`` event of ``get_logger`` as a record frame, ``(LOG_FRAME, time, *values, seq)``: ``values``
        are its data's first eight (``RECORD_KEYS``, of ``RECORD_TYPES``), sent without their keys."""
        with self._lock:
            self._seq = seq = self._seq + 1
            header = marshal.dumps((LOG_FRAME, time.monotonic(), *values, seq), MARSHAL_VERSION)
            safe = _escaped(values, header) if _MAYBE_SURROGATE in header else None
            if safe is not None:
                values = safe
                header = marshal.dumps((LOG_FRAME, time.monotonic(), *values, seq), MARSHAL_VERSION)
            frame = FRAME_HEADER.pack(len(header), 0) + header
            if len(frame) > _PIPE_BUF and os.getpid() != self._owner_pid:
                frame = _shrink_to_pipe_buf(self.rank, seq, LOG, dict(zip(RECORD_KEYS, values)))
            self._write(frame)
            if safe is not None:
                self._say_escaped(LOG)

    def emit_text(self, stream: int, text: str) -> None:
        """An ``output`` event as a text frame: its header is only ``(stream, text)`` (``TEXT_STREAMS``), which
        costs both ends a third of the event's dict (the kernel times and numbers the lines it cuts from it)."""
        with self._lock:
            header = marshal.dumps((stream, text), MARSHAL_VERSION)
            safe = _escaped(text, header) if _MAYBE_SURROGATE in header else None
            if safe is not None:
                text = safe
                header = marshal.dumps((stream, text), MARSHAL_VERSION)
            frame = FRAME_HEADER.pack(len(header), 0) + header
            if len(frame) > _PIPE_BUF and os.getpid() != self._owner_pid:
                self._seq += 1
                frame = _shrink_to_pipe_buf(self.rank, self._seq, OUTPUT, {"stream": TEXT_STREAMS[stream],
                                                                            "text": text})
            self._write(frame)
            if safe is not None:
                self._say_escaped(OUTPUT)

    def _write(self, frame: bytes) -> None:
        """One frame, with the lock held: a pipe takes a small frame whole in one write, a large one perhaps in
        parts."""
        written = os.write(self.fd, frame)
        if written < len(frame):
            write_all(self.fd, memoryview(frame)[written:])

    def emit_parts(self, kind: str, data: dict, parts: list) -> None:
        """One event whose attachment is several buffers, written one after the other without joining them (a
        large result: its tensors' memory goes to the pipe as it is)."""
        with self._lock:
            self._seq += 1
            size = sum(memoryview(part).nbytes for part in parts)
            header = marshal.dumps({"v": SCHEMA_VERSION, "rank": self.rank, "seq": self._seq,
                                    "time": time.monotonic(), "kind": kind, "data": data}, MARSHAL_VERSION)
            safe = _escaped(data, header) if _MAYBE_SURROGATE in header else None
            if safe is not None:
                header = marshal.dumps({"v": SCHEMA_VERSION, "rank": self.rank, "seq": self._seq,
                                        "time": time.monotonic(), "kind": kind, "data": safe}, MARSHAL_VERSION)
            write_all(self.fd, FRAME_HEADER.pack(len(header), size) + header)
            for part in parts:
                write_all(self.fd, part)
            if safe is not None:
                self._say_escaped(kind)

    def _say_escaped(self, route: str) -> None:
        """With the lock held, after a frame whose text was escaped: a ``text_escaped`` event, once per process."""
        if self.escaped:
            return
        self.escaped = True
        self._seq += 1
        self._write(encode_frame(self.rank, self._seq, TEXT_ESCAPED, {"route": route}))


def _shrink_to_pipe_buf(rank: int, seq: int, kind: str, data: dict) -> bytes:
    """A descendant's frame cut to one atomic write: long text fields are shortened (no attachment)."""
    data = dict(data)
    limit = 2048
    while True:
        for key, value in data.items():
            if isinstance(value, str) and len(value) > limit:
                data[key] = value[:limit] + " [cut]"
        frame = encode_frame(rank, seq, kind, data)
        if len(frame) <= _PIPE_BUF or limit < 64:
            return frame
        limit //= 2

