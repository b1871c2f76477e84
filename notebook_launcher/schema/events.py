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

Kinds of events
---------------
Below, each kind's data in words; ``DATA_SCHEMA`` is the same as a table, field by field, which the kernel checks
every event a rank sends against as it reads it (``decoding.check_data``): a field of the wrong type, a required
one missing, NaN or an infinity where a number is expected, a list or dict beyond its bound, a key that is not
a str, or a kind without a table there ends that rank's stream as one ``CorruptEventStream`` failure, which
names the kind and the field. Fields a table does not name pass through unread (the run log keeps them).

``status``   data: ``{"state": "starting" | "running" | "finished" | "failed"}``, with ``pid`` and ``local_rank``
             when starting and ``exit_code`` when finished or failed
``stream``   data: ``{"stream": "stdout" | "stderr", "text": <one line without its newline>}`` (made by the kernel:
             from ``output`` events, and from the worker's fd 1/2 pipes, so C/C++ output arrives too); with
             ``"redraw": True`` it is the newest state of a line still being redrawn with ``\r`` (a tqdm bar)
``output``   data: ``{"stream", "text"}``: a piece of text the worker's Python code wrote to sys.stdout/stderr
             (on the event channel, so it keeps its order with log records; the kernel cuts it into lines).
             A worker sends it as a *text frame*, whose header is only the tuple ``(0 | 1, text)``
             (``TEXT_STREAMS``: stdout, stderr), without rank, seq, time or kind (``EventWriter.emit_text``);
             likewise a ``log`` record of ``get_logger`` (without exc_text, stack or in_order) as a *record
             frame*, ``(LOG_FRAME, time, level, levelno, logger, message, file, line, function, created, seq)``:
             its data's values in ``RECORD_KEYS``' order, without the keys (``emit_record``)
``result``   data: ``{"type": <type name>, "bytes": <size>, "attachment_bytes", "pickle_bytes", "storages": [sizes]}``;
             attachment: the pickle, then the raw bytes of each tensor storage (``results.py``); or, for a value
             not sent, ``{"type", "kept": False, "reason"}`` and no attachment; with ``"in_memory": True`` (and
             no ``attachment_bytes``) the same bytes are in the kernel's in-memory file for the rank
             (``result_memory.py``) and there is no attachment; ``memory_failed``: why they are not
``failure``  data: ``{"type", "module", "message", "traceback", "exit_code"}``: the exception that ended the
             worker (the kernel also makes ``TruncatedEvent`` and ``CorruptEventStream`` failures)
``exit``     data: ``{"exit_code", "signal", "signal_name", "stopped_by_launcher"}`` (made by the kernel when it
             reaps the worker; a negative exit code is the signal that killed it)
``launcher`` data: ``{"text": ...}``: a note from the launcher itself (restarts, teardown)
``shape_mismatch`` data: ``{"operation", "operations", "shapes", "dtypes", "call_sites", "message"}``: debug
             mode found ranks disagreeing on a collective (sent once, by rank 0; every rank then raises)
``trigger``  data: ``{"call_site"}``: this rank called set_trigger()
``batch_size`` data: ``{"key", "batch_size"}``: find_executable_batch_size starts a try at this size
``oom_retry`` data: ``{"key", "ranks", "batch_size", "new_batch_size", "error", "memory"}`` (made by the kernel):
             rank(s) ran out of memory; every rank restarts at the new size. A rank's own report travels as
             the ``oom_retry`` field of its ``failure`` event
``restart``  data: ``{"attempt", "reason": "out of memory" | "failure", "batch_size", "text"}`` (made by the
             kernel): every rank starts again, as attempt ``attempt``
``progress`` data: ``{"step", "total", "metrics": {name: number}}``: ``report(step=..., **metrics)``
``log``      data: ``{"level", "levelno", "logger", "message", "file", "line", "function", "created"}``, and
             ``"exc_text"``, ``"stack"``, ``"in_order"`` when the record has them: one logging record
             (``get_logger``, plain ``logging``, ``warnings.warn``). ``in_order`` is the rank's count of
             in_order calls; a record
             ``{"in_order": n, "skipped": True}`` says the rank's level filtered its record of call n out
``balance``  data: ``{"elapsed", "waited", "steps": [[step, seconds since start, seconds waited so far]
             (+ for DDP's steps: the step's wait in its backward, null where not sampled; "so far" then
             leaves DDP's backward out)],
             "step_source": "ddp" | "report" | None, "final", "peak_rss", "cuda": {"peak_allocated",
             "peak_reserved", "total"} | None}``: the rank's time in collectives and its memory, a few times a
             minute and at the function's end (``balance_meter``; read by ``balance.py``)
``display``  data: ``{"op": "display" | "update" | "clear", "data": {mime: str | dict | list}, "metadata": {...},
             "display_id": str | None, "wait": bool, "omitted": [mime types], "bytes": int}``: what IPython would
             have published from the rank (``display()``, a matplotlib figure, ``update_display``,
             ``clear_output``), as Jupyter's wire form (binary data base64); ``omitted``: MIME types the rank left
             out (over ``rich_output.MAX_BUNDLE_BYTES``, over the rank's budget for the run, or a widget view),
             ``bytes`` the size of the bundle and its metadata before that (``rank/rich_output.py``; shown by
             ``display/rich.py``)
``text_escaped`` data: ``{"route": <the kind of the event>}``: text this rank sent held lone surrogates
             (``"\\ud800"``, which no UTF-8 can carry and which made jupyter_client and print() raise): the writer
             sent each as its backslash escape (``wire_text``, as a print's), and says so once per process (the
             panel's notes and the text display say it once per run)
``hang_notice`` data: ``{"state": "open", "quiet_s", "ranks": {rank: {"state": "waiting" | "in_ddp" | "busy" |
             "finished" | "exited", "text", "waited" (s, while waiting)}}, "diverged": rank | None, "stacks": {rank:
             text}, "text", "verdict" (the line saying which ranks wait where, or ""), "timeout" (s or None),
             "timeout_in" (s left until ``timeout`` stops the run, when it is set)}`` or
             ``{"state": "cleared", "quiet_s", "text"}`` (made by the kernel, rank -1): the stall watchdog saw no
             rank make progress for ``hang_warning`` seconds while one waits in a collective (``hangs.StallWatch``)
"""

from __future__ import annotations

import json
import marshal
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .wiretext import MAYBE_SURROGATE as _MAYBE_SURROGATE
from .wiretext import escaped as _escaped

SCHEMA_VERSION = 1
TRUE_VALUES = ("1", "true", "yes", "on", "y", "t")  # how Accelerate reads a flag such as ACCELERATE_DEBUG_MODE
FRAME_HEADER = struct.Struct(">II")
MARSHAL_VERSION = 2  # no back-references: a fifth faster to read than the default (4), the same to write

# compact frames, whose header is a tuple: (0 | 1, text) is an ``output`` event (its stream: TEXT_STREAMS[0 | 1]),
# (LOG_FRAME, time, *values) a ``log`` event (the rank is the pipe's; the kernel numbers every event and times text)
TEXT_STREAMS = ("stdout", "stderr")
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

STATUS = "status"
STREAM = "stream"
RESULT = "result"
FAILURE = "failure"
EXIT = "exit"
LAUNCHER = "launcher"
LOG = "log"
SHAPE_MISMATCH = "shape_mismatch"
TRIGGER = "trigger"
BATCH_SIZE = "batch_size"
OUTPUT = "output"
OOM_RETRY = "oom_retry"
PROGRESS = "progress"
RESTART = "restart"
HANG_NOTICE = "hang_notice"
BALANCE = "balance"
DISPLAY = "display"
TEXT_ESCAPED = "text_escaped"
TRUNCATED_EVENT = "TruncatedEvent"  # a failure the kernel makes: an event cut short by the worker's death
CORRUPT_EVENT_STREAM = "CorruptEventStream"  # a failure the kernel makes: bytes on an event pipe that are no event
# kinds an agent of a launch across hosts sends besides its ranks' events
AGENT_EVENT = "agent"  # data {"master_port": p} from node 0's agent, {"done": exit_code} at its end
NOTE_EVENT = "note"  # data {"text"}: a line of an agent's own launcher
NODE_ERROR_EVENT = "node_error"  # data {"type", "message", "traceback"}: the launch on that host ended so
# never on a rank's own event pipe: the kernel (or an agent) makes these
KERNEL_ONLY_KINDS = (STREAM, EXIT, LAUNCHER, OOM_RETRY, RESTART, HANG_NOTICE, AGENT_EVENT, NOTE_EVENT,
                     NODE_ERROR_EVENT)


# -- the data of each kind a rank sends, as the kernel checks it (decoding.check_data) ------------------------------
NUMBER = "number"  # an int, or a float that is neither NaN nor infinite (never a bool)


@dataclass(frozen=True)
class ListOf:
    """A list (or tuple) of at most ``most`` items, each of ``item``."""

    item: Any
    most: int = 1 << 16


@dataclass(frozen=True)
class MapOf:
    """A dict of at most ``most`` names (str) to values of ``value``."""

    value: Any
    most: int = 1 << 12


@dataclass(frozen=True)
class OneOf:
    """One of these strings."""

    values: tuple


@dataclass(frozen=True)
class Fields:
    """A dict with these fields, each of its type where present; ``required`` must be present. Other fields (with
    str keys) pass through unread: the run log keeps them."""

    types: dict
    required: tuple = ()


# A field's type: str, int or bool (exactly: a bool is not an int), NUMBER, None, ListOf, MapOf, OneOf, Fields,
# or a tuple of types (any of them). Every kind a rank's pipe may carry has its table; any other is refused.
OOM_REPORT = Fields({"key": str, "batch_size": int, "new_batch_size": int, "error": str,
                     "memory": MapOf(NUMBER)}, required=("key", "batch_size", "new_batch_size"))
DATA_SCHEMA = {
    STATUS: Fields({"state": OneOf(("starting", "running", "finished", "failed")), "pid": int, "local_rank": int,
                    "exit_code": (int, None), "host": str, "thread": str}, required=("state",)),
    OUTPUT: Fields({"stream": OneOf(TEXT_STREAMS), "text": str}, required=("text",)),
    RESULT: Fields({"type": str, "bytes": int, "attachment_bytes": int, "pickle_bytes": int,
                    "storages": ListOf(int, 1 << 24), "kept": bool, "reason": str, "in_memory": bool,
                    "memory_failed": str}, required=("type",)),
    FAILURE: Fields({"type": str, "module": (str, None), "message": str, "traceback": str, "exit_code": (int, None),
                     "all_ranks_raise": bool, "oom_retry": (OOM_REPORT, None)}, required=("type", "message")),
    # (a record of another shape than get_logger's: logging leaves funcName, lineno and the like None at times)
    LOG: Fields({"level": (str, None), "levelno": (int, None), "logger": (str, None), "message": str,
                 "file": (str, None), "line": (int, None), "function": (str, None), "created": (NUMBER, None),
                 "exc_text": (str, None), "stack": (str, None), "in_order": int, "skipped": bool}),
    SHAPE_MISMATCH: Fields({"operation": (str, None), "operations": ListOf((str, None)),
                            "shapes": ListOf((ListOf(int, 64), None)), "dtypes": ListOf((str, None)),
                            "call_sites": ListOf((str, None)), "message": str}, required=("message",)),
    TRIGGER: Fields({"call_site": (str, None)}),
    BATCH_SIZE: Fields({"key": str, "batch_size": int}, required=("key", "batch_size")),
    PROGRESS: Fields({"step": (int, None), "total": (int, None), "metrics": MapOf((NUMBER, str))}),
    BALANCE: Fields({"elapsed": NUMBER, "waited": NUMBER, "steps": ListOf(ListOf((NUMBER, None), 4), 1 << 20),
                     "step_source": (str, None), "final": bool, "peak_rss": (NUMBER, None),
                     "cuda": (Fields({"peak_allocated": NUMBER, "peak_reserved": NUMBER, "total": NUMBER}), None)},
                    required=("elapsed", "waited")),
    # (the bundle and its metadata: dicts whose names are str all the way down, read by display/rich.py)
    DISPLAY: Fields({"op": OneOf(("display", "update", "clear")), "display_id": (str, None), "wait": bool,
                     "omitted": ListOf(str, 64), "bytes": int}, required=("op",)),
    TEXT_ESCAPED: Fields({"route": str}),
}


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


@dataclass
class WorkerSpec:
    """What the kernel tells one worker: who it is, where to write, how to join the group.

    Under fork the spec is inherited as an object; under spawn it travels as JSON in the environment variable
    ``NOTEBOOK_LAUNCHER_WORKER``, so this dataclass is the whole contract between the two sides.
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: str  # "cpu" | "cuda" | "xla"
    backend: str  # "gloo" | "nccl" | ...
    env: dict  # torch.distributed and ACCELERATE_* variables for this rank
    events_fd: int
    stdout_fd: int
    stderr_fd: int
    parent_pid: int
    cpu_threads: int  # intra-op threads for torch on CPU runs; 0 leaves torch's default
    payload_path: str = ""  # spawn only: the cloudpickled (function, args)
    store_listen_fd: int = -1  # rank 0 only: the kernel's listening socket for the TCPStore server
    debug: bool | None = None  # debug mode forced on/off; None: ACCELERATE_DEBUG_MODE decides at each call
    progress_path: str = ""  # the rank's progress record (see ProgressRecord)
    result_path: str = ""  # the kernel's in-memory file for a large result (see result_memory.py); "": the pipe
    memory_limit: int = 0  # bytes of address space the worker may use (RLIMIT_AS); 0: no limit
    explicit_store: bool = False  # True: connect to the store at MASTER_ADDR:MASTER_PORT that rank 0 serves
    results: str = "auto"  # which ranks send their return value (see results.py)
    # device "xla": this one process is the XLA host of every rank; [rank, events, stdout, stderr] of the others
    ordinal_fds: list = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))
