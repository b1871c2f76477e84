"""Kernel side of a rank's pipes: bytes in, checked frames and whole lines out.

Everything read here is untrusted (a rank's code can write anything on any fd): the decoder checks each frame
against the schema of ``events`` before anything else sees it, and the line splitter bounds what a line can
cost.
"""

from __future__ import annotations

import marshal
import mmap

from .datacheck import bounds_problem, data_problem
from .events import (
    FRAME_HEADER,
    LOG,
    LOG_FRAME,
    RECORD_FRAME_FIELDS,
    RECORD_FRAME_TYPES,
    RESULT,
    TEXT_STREAMS,
    Event,
)
from .wiretext import SURROGATE_BYTES, wire_safe

MAX_HEADER_BYTES = 256 * 2**20  # an event's own data; a longer header length can only be a corrupt frame
MAX_NESTING = 64  # lists and dicts within each other in an event's data
_INT_BOUND = 1 << 63


class CorruptFrame(ValueError):
    """Bytes on an event pipe that are not a frame of this schema (a bad length, header or data)."""


class FrameDecoder:
    """Kernel side: turns bytes read from an event pipe into (header, attachment) pairs.

    Everything read is untrusted: at the first frame whose lengths, header or data do not fit the schema,
    ``broken`` says why and the decoder takes nothing more; the frames before it are returned; it never raises.
    Text in an event is passed on as UTF-8 can carry it: a lone surrogate that a writer other than
    ``EventWriter`` left in a dict frame (the writer escapes them at the source) becomes its backslash escape here
    (``wiretext``), so none reaches jupyter_client or print(); a compact frame's (a print's, a record's) is
    escaped where it is shown, at no cost to the reader's hot path.

    A header is checked as soon as it is complete, before its attachment arrives; an attachment is read into the
    buffers that ``sinks`` gives for it (by default one bytearray; a size instead of a buffer: the attachment's
    ``part(index)`` makes it when its first byte arrives), so a large result is copied once, not grown and copied
    again. ``refused_kinds``: kinds that only the kernel makes (a rank's pipe may not carry them);
    ``rank_pipe``: each event's data is checked against its kind's table too (``datacheck``), and a kind without
    one is refused.
    """

    def __init__(self, sinks=None, refused_kinds=(), rank_pipe=False):
        self._buffer = bytearray()
        self._at = 0  # where the next frame starts in _buffer (the consumed part is dropped once per feed)
        self._sinks = sinks or _one_bytearray
        self._refused = frozenset(refused_kinds)
        self._rank_pipe = rank_pipe
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
        try:
            view = memoryview(chunk)
            if self._header is not None:  # an attachment still arriving: straight from the chunk into its buffers
                view = self._fill(view)
                if self._pending:
                    return frames
                frames.append(self._take())
            self._buffer += view
            while True:
                self._small_frames(frames)
                if not self._next_header():
                    break
                if self._pending:
                    self._fill_from_buffer()
                    if self._pending:
                        break
                frames.append(self._take())
        except CorruptFrame as exc:
            self.broken = str(exc)
            self.discard()
        finally:
            del self._buffer[:self._at]
            self._at = 0
        return frames

    def _small_frames(self, frames: list) -> None:
        """The frames without an attachment at the front of the buffer (every log line and print), in one tight
        loop; it stops at anything else (an attachment, an incomplete or a bad frame) for ``_next_header``."""
        buffer, at, refused, rank_pipe = self._buffer, self._at, self._refused, self._rank_pipe
        size, unpack, loads, total = FRAME_HEADER.size, FRAME_HEADER.unpack_from, marshal.loads, len(buffer)
        with memoryview(buffer) as view:
            while total - at >= size:
                header_len, attachment_len = unpack(buffer, at)
                end = at + size + header_len
                if attachment_len or not 0 < header_len <= MAX_HEADER_BYTES or end > total:
                    break
                try:
                    header = loads(view[at + size:end])
                except (ValueError, EOFError, TypeError):
                    break  # (_next_header says why)
                check_header(header, 0, refused, rank_pipe)
                if type(header) is dict and SURROGATE_BYTES.search(buffer, at + size, end):
                    header = wire_safe(header)  # (a lone surrogate, maybe, from a writer not ours; compact frames:
                    # their text is escaped by the LineSplitter and where the displays write it, see wiretext)
                frames.append((header, b""))
                at = end
        self._at = at

    def _next_header(self) -> bool:
        """Take one header off the buffer once it is complete; False while it is not."""
        at = self._at
        if len(self._buffer) - at < FRAME_HEADER.size:
            return False
        header_len, attachment_len = FRAME_HEADER.unpack_from(self._buffer, at)
        if not 0 < header_len <= MAX_HEADER_BYTES:
            raise CorruptFrame(f"a frame header of {header_len} bytes")
        end = at + FRAME_HEADER.size + header_len
        if len(self._buffer) < end:
            return False
        try:
            header = marshal.loads(memoryview(self._buffer)[at + FRAME_HEADER.size:end])
        except (ValueError, EOFError, TypeError) as exc:
            raise CorruptFrame(f"an undecodable frame header ({exc})") from None
        check_header(header, attachment_len, self._refused, self._rank_pipe)
        if SURROGATE_BYTES.search(self._buffer, at + FRAME_HEADER.size, end):
            header = wire_safe(header)
        attachment, parts = b"", []
        if attachment_len:
            try:
                attachment, parts = self._sinks(header, attachment_len)
            except Exception as exc:  # noqa: BLE001 - whatever the header made the sinks refuse
                raise CorruptFrame(f"no room for an attachment of {attachment_len} bytes ({exc})") from None
            if sum(part if type(part) is int else part.nbytes for part in parts) != attachment_len:
                raise CorruptFrame(f"an attachment of {attachment_len} bytes that does not match its header")
        self._at = end
        self._header, self._attachment, self._parts, self._pending = header, attachment, parts, attachment_len
        self._filling = self._filled = 0
        return True

    def _fill_from_buffer(self) -> None:
        with memoryview(self._buffer) as whole:
            rest = self._fill(whole[self._at:])
            self._at = len(self._buffer) - rest.nbytes
            rest.release()

    def _fill(self, view: memoryview) -> memoryview:
        """Copy bytes of the current attachment from ``view``; returns what is left of ``view``."""
        while self._pending and view.nbytes:
            part = self._parts[self._filling]
            if type(part) is int:  # a part the sinks make when its first byte arrives (results.ResultParts)
                part = self._parts[self._filling] = self._make_part(part)
            take = min(part.nbytes - self._filled, view.nbytes)
            part[self._filled:self._filled + take] = view[:take]
            view = view[take:]
            self._filled += take
            self._pending -= take
            if self._filled == part.nbytes:
                self._filling, self._filled = self._filling + 1, 0
        return view

    def _make_part(self, size: int) -> memoryview:
        try:
            return self._attachment.part(self._filling)
        except Exception as exc:  # noqa: BLE001 - whatever the header made the sinks refuse
            raise CorruptFrame(f"no room for a part of {size} bytes of an attachment ({exc})") from None

    def _take(self) -> tuple[dict, object]:
        frame = (self._header, self._attachment)
        self._header, self._attachment, self._parts = None, None, []
        return frame

    def discard(self) -> None:
        self._buffer.clear()
        self._at = 0
        self._header, self._attachment, self._parts, self._pending = None, None, [], 0

    @property
    def frame_pending(self) -> int:
        """Bytes still to come of the frame being read, when it is known to be longer than what has come (a
        result's attachment, a long header); 0 otherwise."""
        if self._header is not None:
            return self._pending
        at, buffer = self._at, self._buffer
        if len(buffer) - at < FRAME_HEADER.size:
            return 0
        header_len, attachment_len = FRAME_HEADER.unpack_from(buffer, at)
        return max(0, FRAME_HEADER.size + header_len + attachment_len - (len(buffer) - at))

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame (non-zero at EOF means the writer died mid-frame)."""
        return len(self._buffer) - self._at + (self._pending if self._header is not None else 0)


def _one_bytearray(header: dict, length: int):
    buffer = bytearray(length)
    return buffer, [memoryview(buffer)] if length else []


_HEADER_TYPES = {"rank": int, "seq": int, "kind": str, "data": dict}


def _record_frame_check():
    """The test of a record frame, made once from ``events.RECORD_FRAME_TYPES`` as one expression (as
    ``dataclasses`` makes an ``__init__``): as fast as the types spelled out by hand (a third of the time of
    comparing ``map(type, ...)``, on every log record of a flood), and it cannot drift from the declaration."""
    terms = [f"len(h) == {len(RECORD_FRAME_TYPES)}", f"h[0] == {LOG_FRAME}"]
    for index, kind in enumerate(RECORD_FRAME_TYPES):
        terms.append(f"type(h[{index}]) is {kind.__name__}")
        if kind is int:  # (bounded: JSON readers of the run log take 64-bit integers)
            terms.append(f"-B <= h[{index}] < B")
    return eval("lambda h: " + " and ".join(terms), {"B": _INT_BOUND, "int": int, "float": float, "str": str})


_is_record_frame = _record_frame_check()
_RECORD_FRAME_TYPE_NAMES = f"({', '.join(kind.__name__ for kind in RECORD_FRAME_TYPES)})"


def check_header(header, attachment_len: int, refused_kinds=frozenset(), rank_pipe: bool = False) -> None:
    """What the kernel relies on in a header: a text frame's (stream, text), a record frame's time and values (of
    ``RECORD_TYPES``), or a dict with an int rank and seq, a number time, a str kind, a dict of data; an attachment
    only where the schema has one (a result, of the size it says); no kind that only the kernel makes."""
    if type(header) is tuple:  # a compact frame: a record frame (events.RECORD_FRAME_FIELDS) or (0 | 1, text)
        if not attachment_len and (_is_record_frame(header) or len(header) == 2 and type(header[0]) is int
                                   and 0 <= header[0] < len(TEXT_STREAMS) and type(header[1]) is str):
            return
        raise CorruptFrame(f"a compact frame that is neither (0 or 1, text) nor a record frame "
                           f"({', '.join(RECORD_FRAME_FIELDS)}) of the types {_RECORD_FRAME_TYPE_NAMES}")
    if type(header) is not dict:  # (marshal makes exact types: a bool is never an int here)
        raise CorruptFrame(f"a frame header that is a {type(header).__name__}, not a dict")
    get = header.get
    if type(get("rank")) is not int or type(get("seq")) is not int or type(get("kind")) is not str or \
            type(get("data")) is not dict or type(get("time")) not in (float, int):
        for key, expected in (*_HEADER_TYPES.items(), ("time", float)):
            if type(get(key)) is not expected and not (key == "time" and type(get(key)) is int):
                raise CorruptFrame(f"a frame header whose {key!r} is {type(get(key)).__name__}")
    if not _within_bounds(header):
        raise CorruptFrame(bounds_problem(header["kind"], header["data"], MAX_NESTING, _INT_BOUND))
    if header["kind"] in refused_kinds:
        raise CorruptFrame(f"a {header['kind']!r} event, which only the kernel makes")
    if rank_pipe:  # every kind a rank may send has its table (events.DATA_SCHEMA)
        if header["time"] - header["time"] != 0:
            raise CorruptFrame(f"a {header['kind']!r} event whose time is {header['time']!r}")
        problem = data_problem(header["kind"], header["data"])
        if problem:
            raise CorruptFrame(problem)
    if attachment_len and header["kind"] != RESULT:
        raise CorruptFrame(f"an attachment of {attachment_len} bytes on a {header['kind']!r} event")
    if header["kind"] == RESULT:
        _check_result_layout(header["data"], attachment_len)
    elif header["kind"] == LOG:
        _check_in_order(header["data"])


def _cut(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def data_within_bounds(data: dict) -> bool:
    """Whether an event's ``data`` is within the reader's bounds where a frame carries it (nesting, 64-bit ints):
    the writer's test of a value of the user's before it sends it (a display's bundle), so the rank sends what
    the kernel reads instead of failing as a corrupt stream."""
    return _within_bounds({"data": data})


def _within_bounds(value, depth: int = 0) -> bool:
    """No int beyond 64 bits (Python will not even write a long enough one as text: the kernel would raise where
    it shows or logs it) and no nesting deeper than ``MAX_NESTING``, anywhere in ``value``. (Strings, floats and
    the like are passed over in the loop: the usual event holds little else.)"""
    kind = type(value)
    if kind is int:
        return -_INT_BOUND <= value < _INT_BOUND
    if kind is dict:
        items = value.values() if all(type(key) is str for key in value) else (*value, *value.values())
    elif kind in (list, tuple, set, frozenset):
        items = value
    else:
        return True
    if depth >= MAX_NESTING:
        return False
    for item in items:
        kind = type(item)
        if kind is str or kind is float or kind is bool or item is None:
            continue
        if kind is int:
            if not -_INT_BOUND <= item < _INT_BOUND:
                return False
        elif not _within_bounds(item, depth + 1):
            return False
    return True


def _check_in_order(data: dict) -> None:
    """A log record's ``in_order`` (the kernel orders records by it) is a call count: an int from 1."""
    if "in_order" in data and (type(data["in_order"]) is not int or data["in_order"] < 1):
        raise CorruptFrame(f"a 'log' event whose 'in_order' is {_cut(data['in_order'])}, not a count from 1")


def _check_result_layout(data: dict, attachment_len: int) -> None:
    """A result's attachment is what its data says: the pickle, then the storages (results.py), to the byte; a
    result in memory has none (its file is checked against its sizes where it is mapped: result_memory.py)."""
    if data.get("in_memory"):
        sizes, pickled = data.get("storages"), data.get("pickle_bytes")
        if attachment_len or not (type(sizes) is list and sizes and type(pickled) is int and pickled > 0
                                  and all(type(size) is int and size > 0 for size in sizes)):
            raise CorruptFrame("a 'result' event in memory with an attachment, or without its 'pickle_bytes' and "
                               "'storages' (sizes from 1)")
        phases = data.get("phases", [-1] * len(sizes))
        if not (type(phases) is list and len(phases) == len(sizes)
                and all(type(phase) is int and -1 <= phase < mmap.PAGESIZE for phase in phases)):
            raise CorruptFrame(f"a 'result' event in memory whose 'phases' are not one per storage, each an offset "
                               f"within a page or -1: {_cut(phases)}")
        return
    if data.get("attachment_bytes", attachment_len) != attachment_len:
        raise CorruptFrame(f"a 'result' event whose attachment is {attachment_len} bytes, not the "
                           f"'attachment_bytes' {_cut(data.get('attachment_bytes'))} it says")
    if "storages" not in data and "pickle_bytes" not in data:
        return  # one pickle (an older agent's result)
    sizes, pickled = data.get("storages"), data.get("pickle_bytes")
    if not (type(sizes) is list and type(pickled) is int and pickled >= 0
            and all(type(size) is int and size > 0 for size in sizes) and pickled + sum(sizes) == attachment_len):
        raise CorruptFrame(f"a 'result' event whose 'pickle_bytes' and 'storages' (sizes from 1) do not add up "
                           f"to its attachment of {attachment_len} bytes")


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

    @property
    def partial_bytes(self) -> int:
        """Bytes of the line not yet ended."""
        return len(self._partial)

    def feed_text(self, text: str) -> list[str]:
        """``feed`` for text a rank's Python code wrote: whole ASCII lines without a carriage return (nearly
        every print and log line) are cut as they are, without the round trip through bytes."""
        if not self._partial and not self._continued and text.endswith("\n") and text.isascii() \
                and "\r" not in text and len(text) <= self.MAX_LINE_BYTES:
            return text[:-1].split("\n")
        return self.feed(text.encode("utf-8", "backslashreplace"))

    def redraw(self) -> str | None:
        """The newest state of an unfinished line that redraws itself with ``\r`` (a tqdm bar), once per change.

        Older redraws are dropped, so a bar that runs for hours costs one line of memory, and the line that
        finally ends with a newline is only its last state (what a terminal shows)."""
        if not self._partial:
            return None
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
    return Event(header["rank"], seq, float(header["time"]), header["kind"], data,
                 attachment if attachment is not None else b"")
