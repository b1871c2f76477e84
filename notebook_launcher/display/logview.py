"""What the inspector shows of a run log, without the widgets: the rows that pass the filters, a page at a time.

``LogView`` holds one run's rows (``logreader.py`` reads them) and the filters the inspector offers: ranks,
kinds, a level (log records at that level and above, or "errors and warnings"), and a case-insensitive search
(substring or regular expression), plus the page shown and the header line. The widget (``inspector.py``) draws
it and feeds it what its controls say; scripts and tests use it as it is::

    view = LogView(run_dir)             # the folder of a run log (runs.resolve_run finds it from an id)
    view.filter(rank=3, level="WARNING", search="nan")
    view.rows, view.page_text, view.go_to_line(1200)

Rows are numbered 1, 2, 3 ... in the order of the run (``Row.number``, the "#" column): row 1200 is the
1200th row of the whole run whatever the filters, so a warning found with a filter can be looked at in its
context (``go_to_line(1200)`` with the filters cleared).
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import time
from typing import Any

from ..schema.events import (
    BATCH_SIZE,
    EXIT,
    FAILURE,
    HANG_NOTICE,
    LAUNCHER,
    LOG,
    OOM_RETRY,
    PROGRESS,
    RESTART,
    RESULT,
    SHAPE_MISMATCH,
    STATUS,
    TRIGGER,
)
from ..schema.runlog import MAX_LOG_BYTES, MAX_RECORD_BYTES, RunFileLines, RunFileRefused, parse_record
from .describe import first_line
from .logreader import _DETAIL, _HAYSTACK, _KIND, _LEVELNO, _NUMBER, _RANK, _TEXT, LogReader, Row, read_summary

ALL = "all"
PAGE_SIZE = 200
MAX_SHOWN_CHARS = 2000  # a longer text (a progress bar redrawn with \r) is cut on the page; event(line) has it all
ERRORS_AND_WARNINGS = "errors and warnings"  # the shortcut level: see is_error_or_warning()
LEVELS = (("every row", 0), ("DEBUG and above", logging.DEBUG), ("INFO and above", logging.INFO),
          ("WARNING and above", logging.WARNING), ("ERROR and above", logging.ERROR), ("CRITICAL", logging.CRITICAL),
          (ERRORS_AND_WARNINGS, ERRORS_AND_WARNINGS))  # the level filter's choices (label, value)
LEVEL_HELP = ("A level shows log records only (get_logger, logging), at that level and above: output lines (print, "
              "stderr) and progress rows are hidden. 'errors and warnings' shows log records at WARNING and above, "
              "failures and tracebacks, non-zero exits, hangs, out-of-memory retries, restarts and stderr lines that "
              "look like an error or a warning.")
_ALWAYS_SHOWN_KINDS = frozenset((FAILURE, SHAPE_MISMATCH, OOM_RETRY, HANG_NOTICE, RESTART))
# a stderr line that reads as an error or a warning: Python's tracebacks and warnings, C++ logs ([W1130 ..., E1130 ...)
_ERROR_LIKE = re.compile(r"error|exception|traceback|warning|fatal|abort|^\[?[EWF]\d{4} ", re.IGNORECASE)
KIND_ORDER = ("stdout", "stderr", LOG, FAILURE, EXIT, STATUS, RESULT, LAUNCHER, PROGRESS, SHAPE_MISMATCH, TRIGGER,
              BATCH_SIZE, OOM_RETRY)  # how the kind filter lists the kinds a run has (others after, by name)
_SUMMARY_KEYS = ("run_id", "status", "device", "backend", "start_method", "num_processes", "world_size", "attempts")


class LogView:
    """One run's log as rows, filtered and paged.

    - ``ranks`` / ``kinds``: tuples of the ranks or kinds shown, ``("all",)`` for all; ``level``: 0 for every
      row, a level number for log records at that level and above only (output lines, progress and other rows
      are hidden), or ``"errors and warnings"`` (``is_error_or_warning``); ``search`` (case-insensitive) and
      ``regex``. ``filter(...)`` sets them from what a user writes; ``set_filters(...)`` as they are.
    - ``all_rows``; ``rows``: those that pass the filters, in the order of the run log; ``error``: why the
      last filter could not apply (an invalid regular expression), else "".
    - ``page`` (1-based, clamped) of ``page_count``, ``page_size``, ``page_rows``, ``page_text``;
      ``go_to_line(n)`` (n: a row's number, the "#" column); ``target_line``: the number of the row it found, to
      mark; ``row(n)``: the row numbered n.
    - ``reload()`` reads what a running run wrote since; ``event(line)`` is one line's whole record.
    """

    def __init__(self, run_dir: str, run: Any = None, *, page_size: int = PAGE_SIZE):
        self.run_dir, self.run = run_dir, run
        self.events_path = os.path.join(self.run_dir, "events.jsonl")
        self.reader = LogReader(self.events_path)
        started = time.perf_counter()
        self.all_rows: list[Row] = self.reader.read_new()[0]
        self.load_seconds = time.perf_counter() - started
        self.summary: dict = {}
        self.refresh_summary()
        self.ranks: tuple = (ALL,)
        self.kinds: tuple = (ALL,)
        self.level: int | str = 0
        self.search = ""
        self.regex = False
        self.error = ""
        self.filter_seconds = 0.0
        self.target_line: int | None = None
        self.rows: list[Row] = []
        self._numbers: list[int] = []  # the number of each filtered row, for go_to_line
        self._page_size = max(1, int(page_size))
        self._page = 1
        self.apply()

    # ---- what can be chosen

    @property
    def rank_options(self) -> list[int]:
        """The ranks of the run: those in the log, and all of the world size its summary or Run gives."""
        return sorted({row[_RANK] for row in self.all_rows} | set(self._summary_ranks()))

    @property
    def kind_options(self) -> list[str]:
        kinds = {row[_KIND] for row in self.all_rows}
        return [kind for kind in KIND_ORDER if kind in kinds] + sorted(kinds.difference(KIND_ORDER))

    def _summary_ranks(self) -> list[int]:
        count = (self.run.world_size if self.run is not None else None) or self.summary.get("world_size")
        return list(range(count)) if isinstance(count, int) and count < 4096 and not self.all_rows else []

    def choice(self, name: str, value: Any) -> tuple:
        """``value`` for the ``name`` ("rank" or "kind") filter: one value or several, "all" for all, checked
        against what this run has."""
        values = tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else (value,)
        known = [ALL, *(self.rank_options if name == "rank" else self.kind_options)]
        unknown = [item for item in values if item not in known]
        if unknown:
            raise ValueError(f"{name}={unknown!r} is not in this run; it has {known}")
        return values

    # ---- filters

    def filter(self, rank: Any = None, kind: Any = None, level: Any = None, search: str | None = None,
               regex: bool | None = None) -> LogView:
        """Set several filters at once (one pass over the rows). ``rank``/``kind``: one value or several
        ("all" for all); ``level``: a level name or number, "errors and warnings", or "all"; None leaves a filter
        as it is."""
        self.set_filters(ranks=None if rank is None else self.choice("rank", rank),
                         kinds=None if kind is None else self.choice("kind", kind),
                         level=None if level is None else levelno(level), search=search,
                         regex=None if regex is None else bool(regex))
        return self

    def set_filters(self, *, ranks: tuple | None = None, kinds: tuple | None = None, level: int | str | None = None,
                    search: str | None = None, regex: bool | None = None, keep_page: bool = False) -> None:
        """Set filters to these values (None: as it is) and apply them."""
        if ranks is not None:
            self.ranks = tuple(ranks)
        if kinds is not None:
            self.kinds = tuple(kinds)
        if level is not None:
            self.level = level
        if search is not None:
            self.search = search
        if regex is not None:
            self.regex = regex
        self.apply(keep_page=keep_page)

    def apply(self, keep_page: bool = False) -> None:
        """Filter the rows again; back to the first page unless ``keep_page``."""
        started = time.perf_counter()
        rows = self.all_rows
        self.error = ""
        ranks = _selected(self.ranks)
        if ranks is not None:
            rows = [row for row in rows if row[_RANK] in ranks]
        kinds = _selected(self.kinds)
        if kinds is not None:
            rows = [row for row in rows if row[_KIND] in kinds]
        if self.level == ERRORS_AND_WARNINGS:
            rows = [row for row in rows if is_error_or_warning(row)]
        elif self.level:
            level = self.level
            rows = [row for row in rows if row[_KIND] == LOG and row[_LEVELNO] >= level]
        needle = self.search
        if needle:
            if self.regex:
                try:
                    search = re.compile(needle, re.IGNORECASE).search
                except re.error as exc:
                    self.error = f"invalid regular expression: {exc}"
                    rows = []
                else:
                    rows = [row for row in rows if search(row[_TEXT]) or (row[_DETAIL] and search(row[_DETAIL]))]
            else:
                lowered = needle.lower()
                rows = [row for row in rows if lowered in row[_HAYSTACK]]
        self.rows = rows
        self._numbers = [row[_NUMBER] for row in rows]
        self.filter_seconds = time.perf_counter() - started
        if not keep_page:
            self._page = 1
            self.target_line = None
        self._page = min(self._page, self.page_count)

    def highlighter(self) -> re.Pattern | None:
        """What to mark in the rows shown: the search, as a pattern (None when there is nothing to mark)."""
        if not self.search or self.error:
            return None
        try:
            return re.compile(self.search if self.regex else re.escape(self.search), re.IGNORECASE)
        except re.error:
            return None

    # ---- pages

    @property
    def page_size(self) -> int:
        return self._page_size

    @page_size.setter
    def page_size(self, value: int) -> None:
        first = (self._page - 1) * self._page_size
        self._page_size = max(1, int(value))
        self._page = first // self._page_size + 1

    @property
    def page_count(self) -> int:
        return max(1, -(-len(self.rows) // self._page_size))

    @property
    def page(self) -> int:
        """The page shown, from 1 to page_count."""
        return self._page

    @page.setter
    def page(self, value: int) -> None:
        self._page = min(max(1, int(value)), self.page_count)
        self.target_line = None

    @property
    def page_rows(self) -> list[Row]:
        start = (self._page - 1) * self._page_size
        return self.rows[start:start + self._page_size]

    @property
    def page_text(self) -> str:
        """The rows of the page as plain text: ``#  time  [rank r]  kind  text`` (# the row's number), each text cut at
        ``MAX_SHOWN_CHARS`` (``event(line)`` has it all)."""
        return "\n".join(f"{row.number:>7}  {elapsed(row.time):>10}  [rank {row.rank}]  "
                         f"{row.level or row.kind:<8}  {cut(row.text)}" for row in self.page_rows)

    def go_to_line(self, number: int) -> Row | None:
        """The page holding row ``number`` (the "#" column: the row's number in the run), or the first row after it
        that the filters keep; that row becomes ``target_line``. Returns it (None, and the page as it was, when no
        row at or after it passes the filters)."""
        index = bisect.bisect_left(self._numbers, int(number))
        if index >= len(self.rows):
            self.target_line = None
            return None
        self._page = index // self._page_size + 1
        self.target_line = self.rows[index].number
        return self.rows[index]

    def row(self, number: int) -> Row | None:
        """The row numbered ``number`` (the "#" column), whatever the filters; None when the run has no such row.
        ``event(row.line)`` is its whole record."""
        index = bisect.bisect_left(self.all_rows, int(number), key=lambda row: row[_NUMBER])
        found = self.all_rows[index] if index < len(self.all_rows) else None
        return found if found is not None and found.number == number else None

    # ---- the run

    def reload(self) -> int:
        """Read the lines the run wrote since the last read (a run still going); a page at the end of the rows
        follows the end. Returns how many rows came."""
        new, stale = self.reader.read_new()
        if stale:  # a progress bar's earlier state, replaced by what came now
            self.all_rows = [row for row in self.all_rows if row[0] not in stale]
        if new:
            self.all_rows.extend(new)
        at_end = self._page == self.page_count
        self.refresh_summary()
        self.apply(keep_page=True)
        if at_end:
            self._page = self.page_count
        return len(new)

    def refresh_summary(self) -> None:
        """run.json (written when the run ends), completed by the Run object of this process when there is one."""
        summary = read_summary(self.run_dir)
        run = self.run
        if run is not None:
            for key in _SUMMARY_KEYS:
                if getattr(run, key, None) is not None and (key not in summary or key == "status"):
                    summary[key] = getattr(run, key)
            if "duration_s" not in summary and getattr(run, "duration", 0):
                summary["duration_s"] = round(run.duration, 4)
        self.summary = summary

    def event(self, line: int) -> dict:
        """The whole record at line ``line`` of events.jsonl (as RunLog wrote it; NaN and infinities of older
        logs as None). Read with the bounds the rows are read with: ``ValueError`` for a line that is not a
        record (``malformed`` in the header), ``IndexError`` for a line the log does not have."""
        lines = RunFileLines(self.run_dir)
        for number, text in enumerate(lines.read(), 1):
            if number == line:
                record = parse_record(text)
                if record is None:
                    raise ValueError(f"line {line} of {self.events_path} is not a record of the run log (not "
                                     f"JSON, or not of its shape, or over {MAX_RECORD_BYTES // 2**20} MB)")
                return record
        if lines.refused:
            raise RunFileRefused(lines.refused)
        raise IndexError(f"events.jsonl of run {self.run_id} has no line {line}")

    @property
    def run_id(self) -> str:
        return self.summary.get("run_id") or os.path.basename(os.path.normpath(self.run_dir))

    @property
    def header_text(self) -> str:
        """The run in a line: id, status, ranks, device, duration, events; then the root cause, if any."""
        summary, reader = self.summary, self.reader
        ranks = sorted({row[_RANK] for row in self.all_rows})
        world = summary.get("world_size") or len(ranks)
        parts = [f"run {self.run_id}", str(summary.get("status") or "no summary yet (running, or stopped "
                                                                      "before it wrote run.json)")]
        parts.append(f"{count(world, 'rank')}" + (f" ({summary['num_processes']} on this node)"
                                                  if summary.get("num_processes") not in (None, world) else ""))
        if summary.get("device"):
            parts.append(f"{summary['device']}/{summary.get('backend')}"
                         + (f" ({summary['start_method']})" if summary.get("start_method") else ""))
        if summary.get("duration_s") is not None:
            parts.append(f"{summary['duration_s']:.2f} s" if isinstance(summary["duration_s"], (int, float))
                         else f"{summary['duration_s']} s")
        if (summary.get("attempts") or 1) > 1:
            parts.append(f"{summary['attempts']} attempts")
        parts.append(count(reader.events, "event"))
        if reader.malformed:
            parts.append(f"{count(reader.malformed, 'malformed record')} skipped")
        if reader.cut:
            parts.append(f"only the first {MAX_LOG_BYTES // 2**20:,} MB of events.jsonl read")
        text = "  ·  ".join(parts)
        if reader.refused:
            text += f"\nevents.jsonl not read: {reader.refused}"
        cause = summary.get("root_cause")
        if isinstance(cause, dict) and cause.get("type"):
            text += f"\nroot cause: rank {cause.get('rank')} {cause['type']}: {first_line(cause.get('message'))}"
        return text


def _selected(values: tuple) -> set | None:
    return None if not values or ALL in values else set(values)


def levelno(level: Any) -> int | str:
    """A level filter from a name ("WARNING", "all", "errors and warnings") or a number."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    name = str(level).strip().lower()
    if name in ("all", "all levels", "every row"):
        return 0
    if name == ERRORS_AND_WARNINGS:
        return ERRORS_AND_WARNINGS
    number = logging.getLevelName(name.upper())
    if not isinstance(number, int):
        raise ValueError(f"level={level!r}: expected DEBUG, INFO, WARNING, ERROR, CRITICAL, a number, "
                         f"{ERRORS_AND_WARNINGS!r} or 'all'")
    return number


def is_error_or_warning(row: Row) -> bool:
    """What the "errors and warnings" level keeps: log records at WARNING and above; failures (their traceback is
    the row's detail), shape mismatches, out-of-memory retries, hang notices and restarts; a rank's exit other than
    0 that the launcher did not ask for; and stderr lines that read as an error or a warning (a traceback's first
    and last lines, a Python warning, a C++ log's W/E/F line). Output on stdout is not looked at."""
    kind = row[_KIND]
    if kind == LOG:
        return row[_LEVELNO] >= logging.WARNING
    if kind == "stderr":
        return _ERROR_LIKE.search(row[_TEXT]) is not None
    if kind == EXIT:
        return row[_TEXT] != "exit code 0" and not row[_TEXT].endswith("(stopped by the launcher)")
    return kind in _ALWAYS_SHOWN_KINDS


def elapsed(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.3f}"  # seconds since the first event; then m:ss.fff, h:mm:ss.fff
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{seconds:06.3f}" if hours else f"{minutes}:{seconds:06.3f}"


def cut(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """``text``, cut at ``limit`` characters with a note of what is left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … ({len(text) - limit:,} more characters; event(line) has it all)"


def count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"
