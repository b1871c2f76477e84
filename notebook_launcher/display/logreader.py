"""A run log as the inspector reads it: its events.jsonl as rows, read as it grows (``runs.resolve_run`` finds it).

Rows are built once, as plain tuples, when the log is read (``describe.py`` says what each kind of event
reads as), so filtering a hundred thousand of them is a few list comprehensions (``logview.py``). No widgets
here: a script, a test or another frontend can read a run log the way the inspector does.
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

from ..schema.events import LOG, STREAM
from .describe import describe, log_text

# Row fields by position, for the filters (index access is what keeps 100k rows fast).
_RANK, _KIND, _LEVELNO, _TEXT, _DETAIL, _HAYSTACK = 2, 3, 5, 6, 7, 8


class Row(NamedTuple):
    """One row of the inspector: one event of the run log."""

    line: int  # line number in events.jsonl (1-based): stable whatever the filters
    time: float  # seconds since the first event of the run
    rank: int
    kind: str  # "stdout" / "stderr" for output lines, else the event kind ("log", "failure", "exit", ...)
    level: str  # log records: the level name; "" otherwise
    levelno: int  # log records: the level number; 0 otherwise
    text: str  # what the row says
    detail: str  # more, shown folded: a traceback, a log record's exception text; "" if none
    haystack: str  # text and detail in lower case, for the search box


# --------------------------------------------------------------------------------------------------------------
# Reading the log into rows


class LogReader:
    """Reads events.jsonl from where it stopped last time (a running run's log grows), whole lines only.

    A line a rank redraws in place (a tqdm bar: ``stream`` events with ``"redraw": True``) is one row, its newest
    state: each state replaces the one before, and the line that ends it (same rank and stream) replaces the last.
    """

    def __init__(self, path: str):
        self.path = path
        self.offset = 0  # bytes consumed: always just after a newline
        self.lines = 0  # lines consumed
        self.events = 0  # lines that were events
        self.unreadable = 0  # lines that were not JSON (a log cut short by a crash)
        self.start: float | None = None  # time of the first event
        self.redrawn = 0  # redraw states replaced by a newer one (not rows)
        self._redraw_at: dict[tuple, int] = {}  # (rank, stream) -> line of its newest redraw state, still a row

    def read_new(self) -> tuple[list[Row], set[int]]:
        """The rows of the lines written since the last read, and the lines of earlier rows that they replace
        (redraw states of a progress bar)."""
        rows = self._read_rows()
        stale = self._stale
        if stale:
            rows = [row for row in rows if row[0] not in stale]
            stale = stale.difference(row[0] for row in rows)  # only earlier reads' rows are left to drop
        return rows, stale

    def _read_rows(self) -> list[Row]:
        self._stale: set[int] = set()
        try:
            with open(self.path, "rb") as source:
                source.seek(self.offset)
                chunk = source.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next read
        if not end:
            return []
        self.offset += end
        lines = chunk[:end].decode("utf-8", errors="replace").split("\n")[:-1]
        first_number = self.lines + 1
        self.lines += len(lines)
        loads = json.loads
        if self.start is None:  # the earliest of the first events (ranks' events arrive slightly out of order)
            times = []
            for line in lines[:1000]:
                try:
                    times.append(float(loads(line)["time"]))
                except (ValueError, KeyError, TypeError, AttributeError):
                    pass
            if times:
                self.start = min(times)
        start = self.start or 0.0
        rows: list[Row] = []
        append = rows.append
        make = tuple.__new__
        redraw_at = self._redraw_at
        for number, line in enumerate(lines, first_number):
            try:
                record = loads(line)
                rank, kind, data = record["rank"], record["kind"], record.get("data")
                when = float(record["time"]) - start
            except (ValueError, KeyError, TypeError, AttributeError):
                if line.strip():
                    self.unreadable += 1  # a line cut short when the kernel died, or not ours
                continue
            self.events += 1
            if kind == STREAM and type(data) is dict:  # the bulk of a big log, inline
                text = str(data.get("text", ""))
                stream = data.get("stream") or "stdout"
                if redraw_at or data.get("redraw"):
                    self._redraw(rank, stream, number, bool(data.get("redraw")))
                append(make(Row, (number, when, rank, stream, "", 0, text, "", text.lower())))
                continue
            if kind == LOG and type(data) is dict and "message" in data and not data.get("exc_text") \
                    and not data.get("stack") and type(data.get("levelno")) is int:
                text = log_text(data.get("logger"), data["message"])
                append(make(Row, (number, when, rank, LOG, str(data.get("level") or ""), data["levelno"], text, "",
                                  text.lower())))
                continue
            if data is None:
                data = {}
            described = describe(kind, data, rank) if isinstance(data, dict) else (str(kind), "", 0, str(data), "", ())
            if described is None:
                continue
            kind_name, level, levelno, text, detail, _ = described
            haystack = f"{text}\n{detail}".lower() if detail else text.lower()
            append(make(Row, (number, when, rank, kind_name, level, levelno, text, detail, haystack)))
        return rows

    def _redraw(self, rank: Any, stream: str, line: int, is_redraw: bool) -> None:
        key = (rank, stream)
        replaced = self._redraw_at.pop(key, None)
        if replaced is not None:
            self._stale.add(replaced)
            self.redrawn += 1
        if is_redraw:
            self._redraw_at[key] = line


def read_summary(run_dir: str) -> dict:
    try:
        with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as source:
            summary = json.load(source)
        return summary if isinstance(summary, dict) else {}
    except (OSError, ValueError):
        return {}

