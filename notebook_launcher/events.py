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
``status``   data: ``{"state": "starting" | "running" | "finished" | "failed"}``, with ``pid`` and ``local_rank``
             when starting and ``exit_code`` when finished or failed
``stream``   data: ``{"stream": "stdout" | "stderr", "text": <one line without its newline>}`` (made by the kernel:
             from ``output`` events, and from the worker's fd 1/2 pipes, so C/C++ output arrives too); with
             ``"redraw": True`` it is the newest state of a line still being redrawn with ``\r`` (a tqdm bar)
``output``   data: ``{"stream", "text"}``: a piece of text the worker's Python code wrote to sys.stdout/stderr
             (on the event channel, so it keeps its order with log records; the kernel cuts it into lines)
``result``   data: ``{"type": <type name>, "bytes": <size>}``; attachment: the pickled return value
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
``progress`` data: ``{"step", "total", "metrics": {name: number}}``: ``report(step=..., **metrics)``
``log``      data: ``{"level", "levelno", "logger", "message", "file", "line", "function", "created",
             "exc_text", "stack", "in_order"}``: one logging record (``get_logger``, plain ``logging``,
             ``warnings.warn``). ``in_order`` is the rank's count of in_order calls (or None); a record
             ``{"in_order": n, "skipped": True}`` says the rank's level filtered its record of call n out
"""

from __future__ import annotations

import json
import marshal
import os
import re
import shutil
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
TRUE_VALUES = ("1", "true", "yes", "on", "y", "t")  # how Accelerate reads a flag such as ACCELERATE_DEBUG_MODE
_FRAME_HEADER = struct.Struct(">II")

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


@dataclass
class Event:
    """One record of what a rank did. ``seq`` orders the events of one rank as the kernel received them."""

    rank: int
    seq: int
    time: float
    kind: str
    data: dict = field(default_factory=dict)
    attachment: bytes = b""

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
         "kind": kind, "data": data})
    return _FRAME_HEADER.pack(len(header), len(attachment)) + header + attachment


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
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def emit(self, kind: str, data: dict | None = None, attachment: bytes = b"") -> None:
        with self._lock:
            self._seq += 1
            frame = encode_frame(self.rank, self._seq, kind, data or {}, attachment)
            if len(frame) > _PIPE_BUF and os.getpid() != self._owner_pid:
                frame = _shrink_to_pipe_buf(self.rank, self._seq, kind, data or {})
            write_all(self.fd, frame)


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


class FrameDecoder:
    """Kernel side: turns bytes read from an event pipe into (header, attachment) pairs."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[tuple[dict, bytes]]:
        self._buffer += chunk
        frames = []
        while len(self._buffer) >= _FRAME_HEADER.size:
            header_len, attachment_len = _FRAME_HEADER.unpack_from(self._buffer)
            end = _FRAME_HEADER.size + header_len + attachment_len
            if len(self._buffer) < end:
                break
            view = memoryview(self._buffer)
            header = marshal.loads(view[_FRAME_HEADER.size:_FRAME_HEADER.size + header_len])
            attachment = bytes(view[_FRAME_HEADER.size + header_len:end])
            view.release()
            del self._buffer[:end]
            frames.append((header, attachment))
        return frames

    def discard(self) -> None:
        self._buffer.clear()

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame (non-zero at EOF means the writer died mid-frame)."""
        return len(self._buffer)


class LineSplitter:
    """Kernel side: turns bytes read from a worker's fd 1/2 pipe into whole lines, never gluing two writes of
    different ranks (each rank has its own pipe and its own splitter)."""

    def __init__(self):
        self._partial = b""
        self._last_redraw = b""

    MAX_LINE_BYTES = 64 * 1024  # a longer unfinished line (a progress bar redrawn with \r) is shown in pieces

    def feed(self, chunk: bytes) -> list[str]:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > self.MAX_LINE_BYTES:
            lines.append(self._partial)
            self._partial = b""
        return [_decode_line(line) for line in lines]

    def redraw(self) -> str | None:
        """The newest state of an unfinished line that redraws itself with ``\r`` (a tqdm bar), once per change.

        Older redraws are dropped, so a bar that runs for hours costs one line of memory, and the line that
        finally ends with a newline is only its last state (what a terminal shows)."""
        cut = self._partial.rfind(b"\r")
        if cut < 0 or cut == len(self._partial) - 1:
            return None  # no redraw, or a line ending in \r whose \n may come in the next read (CRLF)
        latest = self._partial[cut + 1:]
        self._partial = self._partial[cut:]
        if latest == self._last_redraw:
            return None
        self._last_redraw = latest
        return _decode_line(latest)

    def finish(self) -> list[str]:
        """At EOF: the last line even if the worker never ended it with a newline."""
        rest, self._partial = self._partial, b""
        return [_decode_line(rest)] if rest else []


def _decode_line(raw: bytes) -> str:
    """A line as a terminal shows it: what follows its last carriage return."""
    return raw.rstrip(b"\r").rsplit(b"\r", 1)[-1].decode("utf-8", errors="replace")


def event_from_frame(header: dict, attachment: bytes, seq: int) -> Event:
    """Rebuild an event from a decoded frame; the kernel assigns its own per-rank sequence number."""
    data: Any = header.get("data") or {}
    data = dict(data)
    data.setdefault("worker_seq", header.get("seq"))
    return Event(rank=int(header["rank"]), seq=seq, time=float(header["time"]), kind=str(header["kind"]),
                 data=data, attachment=attachment)


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
    memory_limit: int = 0  # bytes of address space the worker may use (RLIMIT_AS); 0: no limit
    explicit_store: bool = False  # True: connect to the store at MASTER_ADDR:MASTER_PORT that rank 0 serves

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> "WorkerSpec":
        return cls(**json.loads(text))


RUNS_DIR_ENV_VAR = "NOTEBOOK_LAUNCHER_RUNS_DIR"
_RUN_ID = re.compile(r"\d{8}-\d{6}-\d+-[0-9a-f]{6}")
KEEP_RUNS = 50


def runs_root() -> str:
    """Where run logs live: $NOTEBOOK_LAUNCHER_RUNS_DIR, else the user's cache directory."""
    explicit = os.environ.get(RUNS_DIR_ENV_VAR)
    if explicit:
        return explicit
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "notebook_launcher", "runs")


class RunLog:
    """One private directory per run: ``events.jsonl`` (every event, as it arrives) and ``run.json`` (summary).

    Only the newest ``KEEP_RUNS`` run directories are kept.
    """

    _FLUSH_EVERY_S = 0.5

    def __init__(self, root: str | None = None):
        root = root or runs_root()
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot create the run log folder {root} ({exc.strerror}); set "
                          f"{RUNS_DIR_ENV_VAR} to a writable folder") from exc
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.run_id = f"{stamp}-{os.getpid()}-{os.urandom(3).hex()}"
        self.path = os.path.join(root, self.run_id)
        os.mkdir(self.path, mode=0o700)
        self._events = open(os.path.join(self.path, "events.jsonl"), "w", encoding="utf-8")
        self._last_flush = time.monotonic()
        _prune(root, keep=KEEP_RUNS)

    def write(self, event: Event) -> None:
        self._events.write(json.dumps(event.to_json(), default=str) + "\n")
        now = time.monotonic()
        if now - self._last_flush > self._FLUSH_EVERY_S:
            self._events.flush()
            self._last_flush = now

    def write_summary(self, summary: dict) -> None:
        with open(os.path.join(self.path, "run.json"), "w", encoding="utf-8") as out:
            json.dump(summary, out, indent=2, default=str)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        if not self._events.closed:
            self._events.close()


def read_run_log(path: str) -> list[dict]:
    """The events of a past run, as written (for reading a run after the fact)."""
    with open(os.path.join(path, "events.jsonl"), encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _prune(root: str, keep: int) -> None:
    try:
        runs = sorted(entry for entry in os.listdir(root)
                      if _RUN_ID.fullmatch(entry) and os.path.isdir(os.path.join(root, entry)))
    except OSError:
        return  # only our own run directories are ever removed, whatever else lives in that folder
    for old in runs[:-keep]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)


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


# -- events across hosts (hosts=...): an agent's frames on its SSH channel, each signed with the run's secret --------
AGENT_EVENT = "agent"  # data {"master_port": p} from node 0's agent, {"done": exit_code} at its end
NOTE_EVENT = "note"  # data {"text"}: a line of an agent's own launcher
NODE_ERROR_EVENT = "node_error"  # data {"type", "message", "traceback"}: the launch on that host ended so
AGENT_ENV_VAR = "NOTEBOOK_LAUNCHER_AGENT"  # mpirun: "kernel-address port secret", for agents to connect back
AGENT_MAGIC = b"NOTEBOOK-LAUNCHER-AGENT/1\n"  # what comes before the frames: anything earlier (a login banner) is skipped
_SIGNED_HEADER = struct.Struct(">I")
_MAC_BYTES = 32
MAX_SIGNED_FRAME = 2**32 - 1  # the largest length the header can say (a rank's pickled result can be GBs)


def node_key(secret: bytes, node_rank: int) -> bytes:
    """Each host signs with a key of its own, derived from the run's secret: a frame of one host's stream does
    not verify in another's."""
    import hmac

    return hmac.new(secret, f"node {node_rank}".encode(), "sha256").digest()


def sign_frame(secret: bytes, counter: int, frame: bytes) -> bytes:
    """``[u32 length][HMAC-SHA256(secret, counter || frame)][frame]``: a frame the kernel accepts only if it comes
    from the agent that was given this run's secret, in order, unmodified."""
    import hmac

    mac = hmac.new(secret, counter.to_bytes(8, "big") + frame, "sha256").digest()
    return _SIGNED_HEADER.pack(len(frame)) + mac + frame


class UnverifiedStream(Exception):
    """A host's stream carried a frame that is not signed with the run's secret (or is out of order)."""


class SignedFrameReader:
    """Kernel side: bytes from one agent's SSH channel → verified ``(header, attachment)`` frames.

    Nothing is decoded before its signature is checked; the first bad frame ends the stream for good.
    """

    def __init__(self, secret: bytes):
        self._secret = secret
        self._buffer = bytearray()
        self._counter = 0
        self._started = False

    def feed(self, chunk: bytes) -> list[tuple[dict, bytes]]:
        import hmac

        self._buffer += chunk
        if not self._started:
            at = self._buffer.find(AGENT_MAGIC)
            if at < 0:
                del self._buffer[:-len(AGENT_MAGIC)]
                return []
            del self._buffer[:at + len(AGENT_MAGIC)]
            self._started = True
        frames = []
        prefix = _SIGNED_HEADER.size + _MAC_BYTES
        while len(self._buffer) >= prefix:
            (length,) = _SIGNED_HEADER.unpack_from(self._buffer)
            if length > MAX_SIGNED_FRAME:
                raise UnverifiedStream(f"a frame of {length} bytes")
            if len(self._buffer) < prefix + length:
                break
            mac = bytes(self._buffer[_SIGNED_HEADER.size:prefix])
            frame = bytes(self._buffer[prefix:prefix + length])
            self._counter += 1
            expected = hmac.new(self._secret, self._counter.to_bytes(8, "big") + frame, "sha256").digest()
            if not hmac.compare_digest(mac, expected):
                raise UnverifiedStream(f"frame {self._counter} is not signed with this run's secret")
            del self._buffer[:prefix + length]
            decoded = FrameDecoder().feed(frame)
            if len(decoded) != 1:
                raise UnverifiedStream(f"frame {self._counter} is not one event")
            frames.append(decoded[0])
        return frames
