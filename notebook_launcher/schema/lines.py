"""Plain lines as the kernel passes them on and keeps them: runs of prints and of log records, and ``Run.events``.

``RankDemux`` makes runs of a rank's lines (``StreamLines``, ``LogRecords``) where it would otherwise make an
Event per line; every stage of the kernel takes a list of them whole (see docs/ARCHITECTURE.md, "One line"), and
``expand_lines`` gives the Events they stand for to whoever wants them one by one. ``EventList`` keeps them as
tuples of plain values, which Python's cyclic collector stops tracking.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence

from .events import LOG, RECORD_DATA, RECORD_KEYS, RECORD_TIME, STREAM, TEXT_STREAMS, Event


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


_RUNS = (StreamLines, LogRecords)


def expand_lines(lines) -> list[Event]:
    """A list of plain lines (Events, ``StreamLines`` and ``LogRecords``) as Events, one per line."""
    return [event for item in lines for event in (item.events() if type(item) in _RUNS else (item,))]


def count_lines(lines) -> int:
    """How many lines a list of plain lines holds."""
    return sum(len(item) if type(item) in _RUNS else 1 for item in lines)


class EventList(Sequence):
    """A list of events (``Run.events``) that keeps plain lines as tuples of plain values.

    Python's cyclic collector tracks every Event and every tuple or dict that holds a dict: 100,000 lines kept as
    Events made it walk them again and again while a flood arrived (half the kernel's time per line). A tuple of
    strings and numbers is untracked at its first collection, so lines kept through ``extend_lines`` cost the
    collector nothing; reading gives Events back (new objects, equal to those kept). A run of lines is kept as
    one tuple, found by index through ``_starts`` (the index of each item's first line).
    """

    def __init__(self, events=()):
        self._items: list = list(events)
        self._starts = array("q", range(len(self._items)))
        self._count = len(self._items)

    def append(self, event: Event) -> None:
        self._items.append(event)
        self._starts.append(self._count)
        self._count += 1

    def extend_lines(self, lines) -> None:
        """Plain lines without an attachment (runs, and Events of stream lines and log records), kept as flat
        tuples: ``StreamLines`` as (rank, seq, time, stream, texts' tuple), ``LogRecords`` as (rank, seq,
        frames' tuple), a stream line as (rank, seq, time, stream, text), any other as (rank, seq, time, kind,
        its data's keys, *their values), the keys' tuple shared by every record that has the same keys."""
        keys, items, starts, count = _SHARED_KEYS, self._items, self._starts, self._count
        for item in lines:
            if type(item) in _RUNS and not len(item):
                continue  # (an empty run holds no line; kept, it would read as one)
            starts.append(count)
            if type(item) is LogRecords:
                items.append((item.rank, item.seq, tuple(item.frames)))
                count += len(item.frames)
                continue
            if type(item) is StreamLines:
                items.append((item.rank, item.seq, item.time, item.stream, tuple(item.texts)))
                count += len(item.texts)
                continue
            data = item.data
            if item.kind == STREAM and len(data) == 2 and type(data.get("text")) is str \
                    and data.get("stream") in _STREAM_NAMES:
                items.append((item.rank, item.seq, item.time, data["stream"], data["text"]))
            else:
                items.append((item.rank, item.seq, item.time, item.kind,
                              keys.setdefault(tuple(data), tuple(data)), *data.values()))
            count += 1
        self._count = count
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
