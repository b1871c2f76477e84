"""Plain lines as the kernel passes them on and keeps them: runs of prints and of log records, and ``Run.events``.

``RankDemux`` makes runs of a rank's lines (``StreamLines``, ``LogRecords``) where it would otherwise make an
Event per line. A run is passed on as one event (it has ``rank``, ``seq``, ``time`` and ``kind`` as an Event
has): every stage of the kernel takes it through the method it takes an Event through, whole (see
docs/ARCHITECTURE.md, "One line"), and ``expand_lines`` gives the Events it stands for to whoever wants them one
by one. ``EventList`` keeps them as
tuples of plain values, which Python's cyclic collector stops tracking, and counts the bytes it holds
(``retained_bytes``), which the kernel bounds (``launchers/intake.py``, ``runs.py``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence
from operator import itemgetter
from sys import getsizeof

from .events import LOG, RECORD_DATA, RECORD_FRAME_TYPES, RECORD_KEYS, RECORD_TIME, STREAM, TEXT_STREAMS, Event


class StreamLines:
    """Consecutive ``stream`` lines of one rank and stream read at one moment, numbered ``seq``, ``seq + 1``, …

    How the kernel passes a flood of prints on: each stage takes the texts whole (a join, a slice), with no Event
    made per line."""

    __slots__ = ("rank", "seq", "time", "stream", "texts")
    kind = STREAM

    def __init__(self, rank: int, seq: int, time: float, stream: str, texts: list[str]):
        self.rank, self.seq, self.time, self.stream, self.texts = rank, seq, time, stream, texts

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        return f"StreamLines(rank={self.rank}, seq={self.seq}, time={self.time}, {self.stream}, {self.texts!r})"

    def events(self) -> list[Event]:
        rank, seq, when, stream = self.rank, self.seq, self.time, self.stream
        return [Event(rank, seq + number, when, STREAM, {"stream": stream, "text": text})
                for number, text in enumerate(self.texts)]


class LogRecords:
    """Consecutive ``get_logger`` records of one rank as their record frames came, numbered ``seq``, ``seq + 1``, …

    A frame is a tuple of ``events.RECORD_FRAME_FIELDS`` (of ``RECORD_FRAME_TYPES``, checked when it was read),
    read by their names' indexes (``frame[RECORD_MESSAGE]``). Each stage reads them in place, with no dict or
    Event made per record."""

    __slots__ = ("rank", "seq", "frames")
    kind = LOG

    def __init__(self, rank: int, seq: int, frames: list[tuple]):
        self.rank, self.seq, self.frames = rank, seq, frames

    @property
    def time(self) -> float:
        """When the last record was made."""
        return self.frames[-1][RECORD_TIME]

    def __len__(self) -> int:
        return len(self.frames)

    def __repr__(self) -> str:
        return f"LogRecords(rank={self.rank}, seq={self.seq}, {self.frames!r})"

    def events(self) -> list[Event]:
        return [record_event(self.rank, self.seq + number, frame) for number, frame in enumerate(self.frames)]


def record_event(rank: int, seq: int, frame: tuple) -> Event:
    """The Event of a record frame."""
    return Event(rank, seq, frame[RECORD_TIME], LOG, dict(zip(RECORD_KEYS, frame[RECORD_DATA])))


RUNS = (StreamLines, LogRecords)  # what ``type(event) in RUNS`` finds: a run of lines, not one Event


def expand_lines(lines) -> list[Event]:
    """A list of plain lines (Events, ``StreamLines`` and ``LogRecords``) as Events, one per line."""
    return [event for item in lines for event in (item.events() if type(item) in RUNS else (item,))]


def retained_bytes(value) -> int:
    """The bytes ``value`` holds in memory: ``sys.getsizeof`` of it and of everything in it (the dicts, lists
    and tuples and what they hold: a display's bundle, its metadata, a widget's view, each counted by what it
    is). An object held twice is counted twice (never less than the truth)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        total += getsizeof(item)
        kind = type(item)
        if kind is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
    return total


def event_bytes(event: Event) -> int:
    """The bytes an Event kept whole holds: the object, its data, its attachment."""
    attachment = event.attachment
    kept = len(attachment) if isinstance(attachment, (bytes, bytearray)) else 0  # (a result's value is elsewhere)
    return getsizeof(event) + getsizeof(event.__dict__) + retained_bytes(event.data) + kept


def lines_bytes(lines) -> int:
    """The bytes ``EventList.extend_lines`` keeps for these plain lines (what it counts for them)."""
    return sum(map(_line_bytes, lines))


def _line_bytes(item) -> int:
    """The bytes of the tuple ``EventList.extend_lines`` keeps for a plain line or a run of them: its tuples,
    numbers and strings, the texts and a record's strings summed in C (what a flood costs)."""
    kind = type(item)
    if kind is StreamLines:
        texts = item.texts
        return _RUN_BYTES + _TUPLE + _POINTER * len(texts) + sum(map(getsizeof, texts)) if texts else 0
    if kind is LogRecords:
        frames = item.frames
        if not frames:
            return 0
        strings = sum(sum(map(getsizeof, map(itemgetter(at), frames))) for at in _FRAME_STRINGS)
        return _RUN_BYTES + _TUPLE + len(frames) * (_POINTER + _FRAME_BYTES) + strings
    data = item.data
    if item.kind == STREAM and len(data) == 2 and type(data.get("text")) is str and data.get("stream") in _STREAM_NAMES:
        return _RUN_BYTES + getsizeof(data["text"])
    return _RUN_BYTES + _POINTER * (1 + len(data)) + sum(map(retained_bytes, data.values()))


class EventList(Sequence):
    """A list of events (``Run.events``) that keeps plain lines as tuples of plain values.

    Python's cyclic collector tracks every Event and every tuple or dict that holds a dict: 100,000 lines kept as
    Events made it walk them again and again while a flood arrived (half the kernel's time per line). A tuple of
    strings and numbers is untracked at its first collection, so lines kept through ``extend_lines`` cost the
    collector nothing; reading gives Events back (new objects, equal to those kept). A run of lines is kept as
    one tuple, found by index through ``_starts`` (the index of each item's first line).

    ``bytes`` is what the kept items hold, counted as they are kept (``lines_bytes``, ``event_bytes``): the
    kernel's bound on a run's memory reads it.
    """

    def __init__(self, events=()):
        self._items: list = []
        self._starts = array("q")
        self._count = 0
        self.bytes = 0
        for event in events:
            self.append(event)

    def append(self, event: Event) -> None:
        self._items.append(event)
        self._starts.append(self._count)
        self._count += 1
        self.bytes += event_bytes(event)

    def extend_lines(self, lines, size: int | None = None) -> None:
        """Plain lines without an attachment (runs, and Events of stream lines and log records), kept as flat
        tuples: ``StreamLines`` as (rank, seq, time, stream, texts' tuple), ``LogRecords`` as (rank, seq,
        frames' tuple), a stream line as (rank, seq, time, stream, text), any other as (rank, seq, time, kind,
        its data's keys, *their values), the keys' tuple shared by every record that has the same keys. ``size``:
        their ``lines_bytes``, where the caller has it already."""
        keys, items, starts, count = _SHARED_KEYS, self._items, self._starts, self._count
        for item in lines:
            if type(item) in RUNS and not len(item):
                continue  # (an empty run holds no line; kept, it would read as one)
            starts.append(count)
            items.append(_kept_item(item, keys))
            count += len(item) if type(item) in RUNS else 1
        self._count = count
        self.bytes += lines_bytes(lines) if size is None else size
        if len(keys) > 1000:
            keys.clear()

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[at] for at in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("EventList index out of range")
        at = bisect_right(self._starts, index) - 1
        return _as_event(self._items[at], index - self._starts[at])

    def __iter__(self):
        for item in self._items:
            size = _run_size(item)
            if size:
                yield from (_as_event(item, number) for number in range(size))
            else:
                yield _as_event(item)

    def __repr__(self) -> str:
        return f"EventList({list(self)!r})"


_SHARED_KEYS: dict = {}  # the keys' tuple of each shape of data kept by EventList.extend_lines
_STREAM_NAMES = frozenset(TEXT_STREAMS)  # a stream tuple's fourth value; a record's is its kind


def _kept_item(item, keys: dict) -> tuple:
    """The tuple ``EventList.extend_lines`` keeps for a plain line or a run of them."""
    if type(item) is LogRecords:
        return (item.rank, item.seq, tuple(item.frames))
    if type(item) is StreamLines:
        return (item.rank, item.seq, item.time, item.stream, tuple(item.texts))
    data = item.data
    if item.kind == STREAM and len(data) == 2 and type(data.get("text")) is str and data.get("stream") in _STREAM_NAMES:
        return (item.rank, item.seq, item.time, data["stream"], data["text"])
    return (item.rank, item.seq, item.time, item.kind, keys.setdefault(tuple(data), tuple(data)), *data.values())


_TUPLE = getsizeof(())
_POINTER = getsizeof((0,)) - _TUPLE
_RUN_BYTES = _TUPLE + 5 * _POINTER + 2 * getsizeof(2**40) + getsizeof(0.0)  # the tuple, rank, seq and time
_FRAME_STRINGS = tuple(at for at, kind in enumerate(RECORD_FRAME_TYPES) if kind is str)
_FRAME_BYTES = _TUPLE + len(RECORD_FRAME_TYPES) * _POINTER + sum(
    getsizeof(2**40 if kind is int else 0.0) for kind in RECORD_FRAME_TYPES if kind is not str)


def _run_size(item) -> int:
    """How many lines an item of ``EventList`` holds when it is a run; 0 when it is one event."""
    if type(item) is not tuple:
        return 0
    if len(item) == 3:
        return len(item[2])
    return len(item[4]) if item[3] in _STREAM_NAMES and type(item[4]) is tuple else 0


def _as_event(item, number: int = 0) -> Event:
    """The Event an item of ``EventList`` stands for (``number``: which line of a run)."""
    if type(item) is not tuple:
        return item
    if len(item) == 3:  # (rank, seq, frames)
        return record_event(item[0], item[1] + number, item[2][number])
    if item[3] in _STREAM_NAMES:  # (rank, seq, time, stream, text or texts)
        rank, seq, when, stream, text = item
        if type(text) is tuple:
            return Event(rank, seq + number, when, STREAM, {"stream": stream, "text": text[number]})
        return Event(rank, seq, when, STREAM, {"stream": stream, "text": text})
    rank, seq, when, kind, keys, *values = item
    return Event(rank, seq, when, kind, dict(zip(keys, values)))
