"""A run log as the inspector reads it: its events.jsonl as rows, read as it grows (``runs.resolve_run`` finds it).

Rows are built once, as plain tuples, when the log is read (``describe.py`` says what each kind of event
reads as), so filtering a hundred thousand of them is a few list comprehensions (``logview.py``). No widgets
here: a script, a test or another frontend can read a run log the way the inspector does.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from ..schema.events import LOG, STREAM
from ..schema.runlog import RunFileLines, parse_record, read_summary
from .describe import describe, log_text, stream_name

__all__ = ["LogReader", "Row", "read_summary"]

# Row fields by position, for the filters (index access is what keeps 100k rows fast).
_RANK, _KIND, _LEVELNO, _TEXT, _DETAIL, _HAYSTACK, _NUMBER = 2, 3, 5, 6, 7, 8, 9


class Row(NamedTuple):
    """One row of the inspector: one event of the run log."""

    line: int  # line number in events.jsonl (1-based): where its record is (``event(line)``)
    time: float  # seconds since the first event of the run
    rank: int
    kind: str  # "stdout" / "stderr" for output lines, else the event kind ("log", "failure", "exit", ...)
    level: str  # log records: the level name; "" otherwise
    levelno: int  # log records: the level number; 0 otherwise
    text: str  # what the row says
    detail: str  # more, shown folded: a traceback, a log record's exception text; "" if none
    haystack: str  # text and detail in lower case, for the search box
    number: int  # the row's number in the run (1-based, what the "#" column shows): stable whatever the filters


# --------------------------------------------------------------------------------------------------------------
# Reading the log into rows


class LogReader:
    """Reads events.jsonl from where it stopped last time (a running run's log grows), whole lines only.

    Whoever wrote the folder, it is read with the bounds of ``schema.runlog``: only a regular file inside the run
    folder (a link out of it, a FIFO or a device: nothing is read, ``refused`` says why), at most
    ``MAX_LOG_BYTES`` (1 GB; then ``cut``), lines of at most ``MAX_RECORD_BYTES`` (16 MB). A line that is not a
    record of the shape RunLog writes (not JSON, cut short by a crash, a list for ``kind``, a dict for ``rank``,
    too long) is skipped and counted in ``malformed``; a time that is not a finite number reads as the time of
    the row before.

    A line a rank redraws in place (a tqdm bar: ``stream`` events with ``"redraw": True``) is one row, its newest
    state: each state replaces the one before, and the line that ends it (same rank and stream) replaces the last.

    Rows are numbered 1, 2, 3 ... in the order of the log, as they are read (``Row.number``): the numbers a user
    sees do not change when the log grows (a bar still redrawing when it was read gives its number up to its newer
    state, the only gap there can be).
    """

    def __init__(self, path: str):
        self.path = path
        self._lines = RunFileLines(os.path.dirname(path) or ".", os.path.basename(path))
        self.events = 0  # lines that were events
        self.malformed = 0  # lines that were not records (a log cut short by a crash, or not ours): skipped
        self.start: float | None = None  # time of the first event
        self._last_time = 0.0  # the time of the row before (for a record without a finite time)
        self.redrawn = 0  # redraw states replaced by a newer one (not rows)
        self._redraw_at: dict[tuple, int] = {}  # (rank, stream) -> line of its newest redraw state, still a row
        self.rows_read = 0  # rows numbered so far

    offset = property(lambda self: self._lines.offset)  # bytes consumed
    lines = property(lambda self: self._lines.lines)  # lines consumed
    refused = property(lambda self: self._lines.refused)  # why events.jsonl is not read; "" when it is
    cut = property(lambda self: self._lines.cut)  # True once MAX_LOG_BYTES were read and there is more
    unreadable = property(lambda self: self.malformed)  # (its former name)

    def read_new(self) -> tuple[list[Row], set[int]]:
        """The rows of the lines written since the last read, and the lines of earlier rows that they replace
        (redraw states of a progress bar)."""
        fields = self._read_rows()
        stale = self._stale
        if stale:
            fields = [row for row in fields if row[0] not in stale]
            stale = stale.difference(row[0] for row in fields)  # only earlier reads' rows are left to drop
        make, first = tuple.__new__, self.rows_read + 1
        rows = [make(Row, (*row, number)) for number, row in enumerate(fields, first)]
        self.rows_read += len(rows)
        return rows, stale

    def _read_rows(self) -> list[tuple]:
        """Each row's fields but its number, in the order of the log (redraw states the read replaced included)."""
        self._stale: set[int] = set()
        first_number = self._lines.lines + 1
        records = []
        for line in self._lines.read():
            record = parse_record(line)
            if record is None and (line is None or line.strip()):
                self.malformed += 1  # a line cut short when the kernel died, too long, or not ours
            records.append(record)
        if not records:
            return []
        if self.start is None:  # the earliest of the first events (ranks' events arrive slightly out of order)
            times = [record["time"] for record in records[:1000] if record is not None and record["time"] is not None]
            if times:
                self.start = min(times)
        start = self.start or 0.0
        rows: list[tuple] = []
        append = rows.append
        redraw_at = self._redraw_at
        last_time = self._last_time
        for number, record in enumerate(records, first_number):
            if record is None:
                continue
            rank, kind, data, when = record["rank"], record["kind"], record["data"], record["time"]
            when = last_time if when is None else when - start
            last_time = when
            self.events += 1
            if kind == STREAM:  # the bulk of a big log, inline
                text = str(data.get("text", ""))
                stream = stream_name(data)
                if redraw_at or data.get("redraw"):
                    self._redraw(rank, stream, number, bool(data.get("redraw")))
                append((number, when, rank, stream, "", 0, text, "", text.lower()))
                continue
            if kind == LOG and "message" in data and not data.get("exc_text") \
                    and not data.get("stack") and type(data.get("levelno")) is int:
                text = log_text(data.get("logger"), data["message"])
                append((number, when, rank, LOG, str(data.get("level") or ""), data["levelno"], text, "",
                        text.lower()))
                continue
            described = describe(kind, data, rank)
            if described is None:
                continue
            kind_name, level, levelno, text, detail, _ = described
            haystack = f"{text}\n{detail}".lower() if detail else text.lower()
            append((number, when, rank, kind_name, level, levelno, text, detail, haystack))
        self._last_time = last_time
        return rows

    def _redraw(self, rank: Any, stream: str, line: int, is_redraw: bool) -> None:
        key = (rank, stream)
        replaced = self._redraw_at.pop(key, None)
        if replaced is not None:
            self._stale.add(replaced)
            self.redrawn += 1
        if is_redraw:
            self._redraw_at[key] = line
