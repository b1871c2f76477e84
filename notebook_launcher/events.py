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

    def emit_parts(self, kind: str, data: dict, parts: list) -> None:
        """One event whose attachment is several buffers, written one after the other without joining them (a
        large result: its tensors' memory goes to the pipe as it is)."""
        with self._lock:
            self._seq += 1
            size = sum(memoryview(part).nbytes for part in parts)
            header = marshal.dumps({"v": SCHEMA_VERSION, "rank": self.rank, "seq": self._seq,
                                    "time": time.monotonic(), "kind": kind, "data": data})
            write_all(self.fd, _FRAME_HEADER.pack(len(header), size) + header)
            for part in parts:
                write_all(self.fd, part)


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


MAX_HEADER_BYTES = 256 * 2**20  # an event's own data; a longer header length can only be a corrupt frame


class CorruptFrame(ValueError):
    """Bytes on an event pipe that are not a frame of this schema (a bad length, header or data)."""


class FrameDecoder:
    """Kernel side: turns bytes read from an event pipe into (header, attachment) pairs.

    Everything read is untrusted: at the first frame whose lengths, header or data do not fit the schema,
    ``broken`` says why and the decoder takes nothing more; the frames before it are returned; it never raises. A header is checked as soon
    as it is complete, before its attachment arrives; an attachment is read into the buffers that ``sinks``
    gives for it (by default one bytearray), so a large result is copied once, not grown and copied again.
    """

    def __init__(self, sinks=None):
        self._buffer = bytearray()
        self._sinks = sinks or _one_bytearray
        self._header: dict | None = None  # a checked header whose attachment is still arriving
        self._parts: list = []  # writable memoryviews the attachment fills, in order
        self._filling = 0  # index into _parts
        self._filled = 0  # bytes written into _parts[_filling]
        self._attachment = None
        self._pending = 0  # attachment bytes still to come
        self.broken = ""  # why the stream stopped being read as frames (the frames before it are returned)

    def feed(self, chunk: bytes) -> list[tuple[dict, object]]:
        if self.broken:
            return []
        frames = []
        view = memoryview(chunk)
        try:
            while True:
                if self._header is not None:
                    view = self._fill(view)
                    if self._pending:
                        break
                    frames.append((self._header, self._attachment))
                    self._header, self._attachment, self._parts = None, None, []
                    continue
                if view.nbytes:
                    self._buffer += view
                    view = view[view.nbytes:]
                if not self._next_header():
                    break
        except CorruptFrame as exc:
            self.broken = str(exc)
            self.discard()
        return frames

    def _next_header(self) -> bool:
        """Take one header off the buffer once it is complete; False while it is not."""
        if len(self._buffer) < _FRAME_HEADER.size:
            return False
        header_len, attachment_len = _FRAME_HEADER.unpack_from(self._buffer)
        if not 0 < header_len <= MAX_HEADER_BYTES:
            raise CorruptFrame(f"a frame header of {header_len} bytes")
        end = _FRAME_HEADER.size + header_len
        if len(self._buffer) < end:
            return False
        try:
            header = marshal.loads(bytes(self._buffer[_FRAME_HEADER.size:end]))
        except (ValueError, EOFError, TypeError) as exc:
            raise CorruptFrame(f"an undecodable frame header ({exc})") from None
        check_header(header, attachment_len)
        rest = self._buffer[end:]
        self._buffer.clear()
        self._header, self._pending = header, attachment_len
        try:
            self._attachment, self._parts = self._sinks(header, attachment_len) if attachment_len else (b"", [])
        except (MemoryError, RuntimeError, OverflowError) as exc:
            raise CorruptFrame(f"no room for an attachment of {attachment_len} bytes ({exc})") from None
        self._filling = self._filled = 0
        if sum(part.nbytes for part in self._parts) != attachment_len:
            raise CorruptFrame(f"an attachment of {attachment_len} bytes that does not match its header")
        self._fill(memoryview(rest))  # what came with the header (the buffer is empty from here on)
        return True

    def _fill(self, view: memoryview) -> memoryview:
        """Copy bytes of the current attachment from ``view``; what is left of ``view`` goes to the buffer."""
        while self._pending and view.nbytes:
            part = self._parts[self._filling]
            take = min(part.nbytes - self._filled, view.nbytes)
            part[self._filled:self._filled + take] = view[:take]
            view = view[take:]
            self._filled += take
            self._pending -= take
            if self._filled == part.nbytes:
                self._filling, self._filled = self._filling + 1, 0
        if not self._pending and view.nbytes and self._header is not None:
            self._buffer += view  # the next frames (the caller's loop takes them)
            view = view[view.nbytes:]
        return view

    def discard(self) -> None:
        self._buffer.clear()
        self._header, self._attachment, self._parts, self._pending = None, None, [], 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame (non-zero at EOF means the writer died mid-frame)."""
        return len(self._buffer) + (self._pending if self._header is not None else 0)


def _one_bytearray(header: dict, length: int):
    buffer = bytearray(length)
    return buffer, [memoryview(buffer)] if length else []


_HEADER_TYPES = {"rank": int, "seq": int, "kind": str, "data": dict}


def check_header(header, attachment_len: int) -> None:
    """What the kernel relies on in a header: a dict with an int rank and seq, a number time, a str kind, a
    dict of data; and an attachment only where the schema has one (a result, of the size it says)."""
    if not isinstance(header, dict):
        raise CorruptFrame(f"a frame header that is a {type(header).__name__}, not a dict")
    for key, expected in _HEADER_TYPES.items():
        if not isinstance(header.get(key), expected) or isinstance(header.get(key), bool):
            raise CorruptFrame(f"a frame header whose {key!r} is {type(header.get(key)).__name__}")
    if not isinstance(header.get("time"), (int, float)):
        raise CorruptFrame(f"a frame header whose 'time' is {type(header.get('time')).__name__}")
    if attachment_len and header["kind"] != RESULT:
        raise CorruptFrame(f"an attachment of {attachment_len} bytes on a {header['kind']!r} event")
    if header["kind"] == RESULT and header["data"].get("attachment_bytes", attachment_len) != attachment_len:
        raise CorruptFrame(f"a result whose attachment is {attachment_len} bytes, not the "
                           f"{header['data'].get('attachment_bytes')} it says")


class LineSplitter:
    """Kernel side: turns bytes read from a worker's fd 1/2 pipe into whole lines, never gluing two writes of
    different ranks (each rank has its own pipe and its own splitter).

    A line is kept whole up to ``MAX_LINE_BYTES``; a longer one is passed on in pieces of that size, each but the
    last ending with ``LINE_CONTINUES`` (memory stays bounded whatever a rank prints without a newline)."""

    MAX_LINE_BYTES = 8 * 2**20
    LINE_CONTINUES = " [line continues]"

    def __init__(self):
        self._partial = b""
        self._last_redraw = b""
        self._continued = False  # the last piece passed on was cut from a line that has not ended yet

    def feed(self, chunk: bytes) -> list[str]:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if lines and self._continued:
            self._continued = False
            if not lines[0]:
                lines.pop(0)  # the newline that ends a line already passed on in pieces
        decoded = [_decode_line(line) for line in lines]
        while len(self._partial) > self.MAX_LINE_BYTES:
            cut = _utf8_boundary(self._partial, self.MAX_LINE_BYTES)
            decoded.append(_decode_line(self._partial[:cut]) + self.LINE_CONTINUES)
            self._partial = self._partial[cut:]
            self._continued = True
        return decoded

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


def _utf8_boundary(data: bytes, at: int) -> int:
    """``at``, moved back to the start of a UTF-8 character (never cut one in two)."""
    for back in range(4):
        if at - back > 0 and data[at - back] & 0xC0 != 0x80:
            return at - back
    return at


def _decode_line(raw: bytes) -> str:
    """A line as a terminal shows it: what follows its last carriage return."""
    return raw.rstrip(b"\r").rsplit(b"\r", 1)[-1].decode("utf-8", errors="replace")


def event_from_frame(header: dict, attachment, seq: int) -> Event:
    """Rebuild an event from a decoded (and checked) frame; the kernel assigns its own per-rank sequence number."""
    data = dict(header["data"])
    data.setdefault("worker_seq", header["seq"])
    return Event(rank=header["rank"], seq=seq, time=float(header["time"]), kind=header["kind"], data=data,
                 attachment=attachment if attachment is not None else b"")


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
    results: str = "auto"  # which ranks send their return value (see results.py)

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

    Only the newest ``KEEP_RUNS`` finished run directories are kept (see ``_prune``).
    """

    _FLUSH_EVERY_S = 0.5

    def __init__(self, root: str | None = None):
        root = root or runs_root()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.run_id = f"{stamp}-{os.getpid()}-{os.urandom(3).hex()}"
        self.path = os.path.join(root, self.run_id)
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            os.mkdir(self.path, mode=0o700)
            self._events = open(os.path.join(self.path, "events.jsonl"), "w", encoding="utf-8")
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write the run log in {root} ({exc.strerror or exc}): set "
                          f"{RUNS_DIR_ENV_VAR} to a folder you can write to") from exc
        self._last_flush = time.monotonic()
        _prune(root, keep=KEEP_RUNS, current=self.run_id)

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


PRUNE_MIN_AGE_S = 600  # a run folder younger than this is never pruned (it may belong to a run in progress)


def _prune(root: str, keep: int, current: str = "") -> None:
    """Keep the ``keep`` newest run folders, newest by the time they last changed (not by the stamp in their name,
    which another kernel's time zone or a clock set back can put in the future). Never removed: the current run,
    any folder changed in the last ``PRUNE_MIN_AGE_S`` seconds, and a folder without its summary whose kernel
    (the pid in its name) is still alive on this machine: those may be runs still going on."""
    now = time.time()
    candidates = []
    try:
        entries = os.listdir(root)
    except OSError:
        return
    for entry in entries:  # only our own run directories are ever removed, whatever else lives in that folder
        path = os.path.join(root, entry)
        if entry == current or not _RUN_ID.fullmatch(entry):
            continue
        try:
            changed = os.stat(path).st_mtime
        except OSError:
            continue
        if not os.path.isdir(path) or now - changed < PRUNE_MIN_AGE_S or _maybe_in_progress(entry, path):
            continue
        candidates.append((changed, entry))
    candidates.sort()
    for _, old in candidates[:max(0, len(candidates) - keep)]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)


def _maybe_in_progress(run_id: str, path: str) -> bool:
    if os.path.exists(os.path.join(path, "run.json")):
        return False
    pid = int(run_id.split("-")[2])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists (owned by someone else)
    return True


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
            decoder = FrameDecoder()
            decoded = decoder.feed(frame)
            if decoder.broken:
                raise UnverifiedStream(f"frame {self._counter} is not an event: {decoder.broken}")
            if len(decoded) != 1:
                raise UnverifiedStream(f"frame {self._counter} is not one event")
            frames.append(decoded[0])
        return frames
