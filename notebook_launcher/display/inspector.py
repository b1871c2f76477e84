"""Browse a whole run log in the notebook: every line of every rank, filtered and paged.

The cell that launched a run shows what the ranks printed as it arrived, mixed together, and the ``Run`` keeps
only so many lines in memory. When a run has printed a hundred thousand lines, or failed an hour ago, or in a
kernel that has been restarted since, the question is "what did rank 3 log at WARNING and above just before it
died?". ``inspect_run()`` answers it from the run log on disk (``events.jsonl``, written by ``RunLog``), the
whole run, in an ipywidgets panel: filter by rank, log level, kind of event and text (substring or regex), one
page of rows at a time (the browser never holds more than a page, so a huge log does not freeze it).

The rows are built once, as plain tuples, when the log is read; a filter is a few list comprehensions over
them. Everything the panel shows is reachable from Python (``inspector.rows``, ``inspector.page``,
``inspector.page_text``), so it can be driven and tested without a browser.
"""

from __future__ import annotations

import bisect
import html
import json
import logging
import os
import re
import time
from typing import Any, NamedTuple

import ipywidgets as widgets

from ..events import _RUN_ID, runs_root
from .describe import describe, first_line, log_text

__all__ = ["Row", "RunInspector", "RunNotFoundError", "inspect_run"]

ALL = "all"
PAGE_SIZE = 200
MAX_SHOWN_CHARS = 2000  # a longer text (a progress bar redrawn with \r) is cut on the page; event(line) has it all
LEVELS = (("all levels", 0), ("DEBUG", logging.DEBUG), ("INFO", logging.INFO), ("WARNING", logging.WARNING),
          ("ERROR", logging.ERROR), ("CRITICAL", logging.CRITICAL))
KIND_ORDER = ("stdout", "stderr", "log", "failure", "exit", "status", "result", "launcher", "progress",
              "shape_mismatch", "trigger", "batch_size", "oom_retry")

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


class RunNotFoundError(LookupError):
    """inspect_run() was given something that names no run log."""


# --------------------------------------------------------------------------------------------------------------
# Finding the run


def _run_dirs(root: str) -> list[str]:
    """Run ids under root, newest first."""
    try:
        names = [entry for entry in os.listdir(root)
                 if _RUN_ID.fullmatch(entry) and os.path.isdir(os.path.join(root, entry))]
    except OSError:
        return []
    return sorted(names, reverse=True)


def _known_runs_note(root: str, limit: int = 5) -> str:
    names = _run_dirs(root)
    if not names:
        return f"There is no run log under {root}."
    more = f" (and {len(names) - limit} older)" if len(names) > limit else ""
    return f"Recent runs under {root}, newest first: {', '.join(names[:limit])}{more}."


def resolve_run(run: Any = None) -> tuple[str, Any]:
    """The run directory for ``run`` (a Run or the error a launch raised, a run id or a unique part of one, a run
    directory or its events.jsonl, or None for the last run), and the Run object when there is one."""
    from ..launcher import last_run, recent_runs

    root = runs_root()
    if run is None:
        current = last_run()
        if current is not None:
            return current.run_dir, current
        names = [name for name in _run_dirs(root) if os.path.exists(os.path.join(root, name, "events.jsonl"))]
        if names:  # a kernel restarted since: the newest run on disk
            return os.path.join(root, names[0]), None
        raise RunNotFoundError(f"inspect_run(): no run was launched in this process and there is no run log "
                               f"under {root}. Pass a Run, a run id or a run directory.")
    if not hasattr(run, "run_dir") and hasattr(getattr(run, "run", None), "run_dir"):
        run = run.run  # the RankFailedError or LaunchTimeoutError of a launch
    if hasattr(run, "run_dir"):
        if not os.path.isdir(run.run_dir):
            raise RunNotFoundError(f"inspect_run({run!r}): its run directory {run.run_dir} no longer exists "
                                   f"(only the newest runs are kept). {_known_runs_note(root)}")
        return run.run_dir, run
    if not isinstance(run, (str, os.PathLike)):
        raise TypeError(f"inspect_run(run={run!r}): expected a Run, a run id, a run directory or None, "
                        f"not a {type(run).__name__}")
    text = os.fspath(run)
    if os.path.basename(text) == "events.jsonl" and os.path.isfile(text):
        text = os.path.dirname(text) or "."
    if os.path.isdir(text) and (os.path.exists(os.path.join(text, "events.jsonl"))
                                or os.path.exists(os.path.join(text, "run.json"))):
        match = [known for known in recent_runs() if os.path.abspath(known.run_dir) == os.path.abspath(text)]
        return text, (match[-1] if match else None)
    for known in reversed(recent_runs()):  # a run of this process, wherever its log lives
        if known.run_id == text and os.path.isdir(known.run_dir):
            return known.run_dir, known
    names = _run_dirs(root)
    if text in names:
        return os.path.join(root, text), None
    candidates = [name for name in names if text and os.sep not in text and text in name]
    if len(candidates) == 1:
        return os.path.join(root, candidates[0]), None
    if len(candidates) > 1:
        raise RunNotFoundError(f"inspect_run({text!r}): {len(candidates)} runs match: "
                               f"{', '.join(candidates[:5])}{' ...' if len(candidates) > 5 else ''}. "
                               "Give more of the run id.")
    what = "directory has no run log (events.jsonl)" if os.path.isdir(text) else "is no run id or run directory"
    raise RunNotFoundError(f"inspect_run({text!r}): this {what}. {_known_runs_note(root)}")


# --------------------------------------------------------------------------------------------------------------
# Reading the log into rows


class _LogReader:
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
                rank, when, kind, data = record["rank"], float(record["time"]) - start, record["kind"], record.get("data")
            except (ValueError, KeyError, TypeError, AttributeError):
                if line.strip():
                    self.unreadable += 1  # a line cut short when the kernel died, or not ours
                continue
            self.events += 1
            if kind == "stream" and type(data) is dict:  # the bulk of a big log, inline
                text = str(data.get("text", ""))
                stream = data.get("stream") or "stdout"
                if redraw_at or data.get("redraw"):
                    self._redraw(rank, stream, number, bool(data.get("redraw")))
                append(make(Row, (number, when, rank, stream, "", 0, text, "", text.lower())))
                continue
            if kind == "log" and type(data) is dict and "message" in data and not data.get("exc_text") \
                    and not data.get("stack") and type(data.get("levelno")) is int:
                text = log_text(data.get("logger"), data["message"])
                append(make(Row, (number, when, rank, "log", str(data.get("level") or ""), data["levelno"], text, "",
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


def _read_summary(run_dir: str) -> dict:
    try:
        with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as source:
            summary = json.load(source)
        return summary if isinstance(summary, dict) else {}
    except (OSError, ValueError):
        return {}


def _elapsed(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.3f}"  # seconds since the first event; then m:ss.fff, h:mm:ss.fff
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{seconds:06.3f}" if hours else f"{minutes}:{seconds:06.3f}"


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


# --------------------------------------------------------------------------------------------------------------
# The panel

_KIND_COLORS = {"stderr": "#b35900", "failure": "#c00000", "exit": "#555", "status": "#555", "launcher": "#1f5fa8",
                "oom_retry": "#b35900", "shape_mismatch": "#c00000", "trigger": "#6a3d9a", "progress": "#2e7d32"}
_LEVEL_COLORS = {logging.WARNING: "#b35900", logging.ERROR: "#c00000", logging.CRITICAL: "#c00000"}
_CELL = "padding:0 8px 0 0;vertical-align:top;white-space:nowrap"
_TEXT_CELL = "padding:0;vertical-align:top;white-space:pre-wrap;word-break:break-all"


class RunInspector(widgets.VBox):
    """A panel over one run's log: filters (rank, log level, kind, text), one page of rows at a time.

    Python API (the widgets are the state; setting a widget's value filters at once):

    - ``rank_filter.value``: a tuple of ranks, or ``("all",)``; ``kind_filter.value``: a tuple of kinds
      ("stdout", "stderr", "log", "failure", ...), or ``("all",)``; ``level_filter.value``: the lowest level of
      log records shown (0 for all; other kinds are not affected); ``search.value``: text, case-insensitive,
      a substring or, with ``regex.value = True``, a regular expression. ``filter(...)`` sets several at once.
    - ``rows``: the rows that pass the filters (``Row`` tuples); ``all_rows``: every row.
    - ``page`` (1-based, clamped) of ``page_count``, ``page_size``; ``page_rows``; ``first_page()``,
      ``previous_page()``, ``next_page()``, ``last_page()``; ``go_to_line(n)``: the page with line n of
      events.jsonl (or the next line the filters keep).
    - ``page_html`` (what the panel shows) and ``page_text`` (the same rows as plain text).
    - ``reload()``: read what a running run wrote since; ``event(line)``: the full record of one line.
    """

    def __init__(self, run: Any = None, *, page_size: int = PAGE_SIZE):
        self.run_dir, self.run = resolve_run(run)
        self.events_path = os.path.join(self.run_dir, "events.jsonl")
        self._page_size = max(1, int(page_size))
        self._page = 1
        self._rows: list[Row] = []
        self._lines: list[int] = []  # the line number of each filtered row, for go_to_line
        self._target_line: int | None = None
        self._quiet = False  # set while several widgets change at once: one filter at the end
        self._error = ""
        self.filter_seconds = 0.0
        self._reader = _LogReader(self.events_path)
        started = time.perf_counter()
        self._all_rows: list[Row] = self._reader.read_new()[0]
        self.load_seconds = time.perf_counter() - started
        self.summary: dict = {}

        self.header = widgets.HTML()
        self.rank_filter = widgets.SelectMultiple(description="rank", rows=4,
                                                  layout=widgets.Layout(width="170px"))
        self.kind_filter = widgets.SelectMultiple(description="kind", rows=4,
                                                  layout=widgets.Layout(width="220px"))
        self.level_filter = widgets.Dropdown(options=LEVELS, value=0, description="log level",
                                             layout=widgets.Layout(width="200px"))
        self.search = widgets.Text(placeholder="search (case-insensitive)", description="search",
                                   continuous_update=True, layout=widgets.Layout(width="320px"))
        self.regex = widgets.Checkbox(value=False, description="regex", indent=False,
                                      layout=widgets.Layout(width="80px"))
        self.first_button = _icon_button("angle-double-left", "first page")
        self.previous_button = _icon_button("angle-left", "previous page")
        self.next_button = _icon_button("angle-right", "next page")
        self.last_button = _icon_button("angle-double-right", "last page")
        self.page_label = widgets.HTML()
        self.line_box = widgets.BoundedIntText(value=1, min=1, max=10**12, description="line",
                                               layout=widgets.Layout(width="170px"))
        self.go_button = widgets.Button(description="go", tooltip="show the page with this line of events.jsonl",
                                        layout=widgets.Layout(width="50px"))
        self.reload_button = _icon_button("refresh", "read what the run wrote since")
        self.status = widgets.HTML()
        self.content = widgets.HTML(layout=widgets.Layout(max_height="520px", overflow="auto",
                                                          border="1px solid #ddd", padding="2px 4px"))

        self._refresh_summary()
        self._update_options()
        self.rank_filter.observe(self._on_choice, names="value")
        self.kind_filter.observe(self._on_choice, names="value")
        for control in (self.level_filter, self.search, self.regex):
            control.observe(self._on_filter, names="value")
        self.first_button.on_click(lambda _: self.first_page())
        self.previous_button.on_click(lambda _: self.previous_page())
        self.next_button.on_click(lambda _: self.next_page())
        self.last_button.on_click(lambda _: self.last_page())
        self.go_button.on_click(lambda _: self.go_to_line(self.line_box.value))
        self.line_box.observe(lambda change: self.go_to_line(change["new"]), names="value")  # on Enter
        self.reload_button.on_click(lambda _: self.reload())

        search_box = widgets.HBox([self.search, self.regex])
        right = widgets.VBox([self.level_filter, search_box])
        filters = widgets.HBox([self.rank_filter, self.kind_filter, right])
        pager = widgets.HBox([self.first_button, self.previous_button, self.page_label, self.next_button,
                              self.last_button, self.line_box, self.go_button, self.reload_button],
                             layout=widgets.Layout(align_items="center"))
        self._boxes = (search_box, right, filters, pager)
        super().__init__([self.header, filters, pager, self.status, self.content])
        self._apply_filters()

    # ---- state

    @property
    def all_rows(self) -> list[Row]:
        return self._all_rows

    @property
    def rows(self) -> list[Row]:
        """The rows that pass the filters, in the order of the run log."""
        return self._rows

    @property
    def page_size(self) -> int:
        return self._page_size

    @page_size.setter
    def page_size(self, value: int) -> None:
        first = (self._page - 1) * self._page_size
        self._page_size = max(1, int(value))
        self._page = first // self._page_size + 1
        self._render()

    @property
    def page_count(self) -> int:
        return max(1, -(-len(self._rows) // self._page_size))

    @property
    def page(self) -> int:
        """The page shown, from 1 to page_count."""
        return self._page

    @page.setter
    def page(self, value: int) -> None:
        self._page = min(max(1, int(value)), self.page_count)
        self._target_line = None
        self._render()

    @property
    def page_rows(self) -> list[Row]:
        start = (self._page - 1) * self._page_size
        return self._rows[start:start + self._page_size]

    @property
    def page_html(self) -> str:
        return self.content.value

    @property
    def page_text(self) -> str:
        """The rows of the page as plain text: ``line  time  [rank r]  kind  text``."""
        return "\n".join(f"{row.line:>7}  {_elapsed(row.time):>10}  [rank {row.rank}]  "
                         f"{row.level or row.kind:<8}  {row.text}" for row in self.page_rows)

    @property
    def error(self) -> str:
        """Why the last filter could not apply (an invalid regex), else ""."""
        return self._error

    # ---- actions

    def first_page(self) -> None:
        self.page = 1

    def previous_page(self) -> None:
        self.page = self._page - 1

    def next_page(self) -> None:
        self.page = self._page + 1

    def last_page(self) -> None:
        self.page = self.page_count

    def go_to_line(self, line: int) -> Row | None:
        """Show the page holding line ``line`` of events.jsonl, or the first line after it that the filters keep;
        that row is marked. Returns it (None when no row at or after that line passes the filters)."""
        index = bisect.bisect_left(self._lines, int(line))
        if index >= len(self._rows):
            self._target_line = None
            self._set_status(f"no row at or after line {int(line):,} passes the filters")
            return None
        self._page = index // self._page_size + 1
        self._target_line = self._rows[index].line
        self._render()
        return self._rows[index]

    def filter(self, rank: Any = None, kind: Any = None, level: Any = None, search: str | None = None,
               regex: bool | None = None) -> RunInspector:
        """Set several filters at once (one pass over the rows). ``rank``/``kind``: one value or several
        ("all" for all); ``level``: a level name or number; None leaves a filter as it is."""
        self._quiet = True
        try:
            if rank is not None:
                self.rank_filter.value = self._choices(rank, self.rank_filter)
            if kind is not None:
                self.kind_filter.value = self._choices(kind, self.kind_filter)
            if level is not None:
                self.level_filter.value = _levelno(level)
            if regex is not None:
                self.regex.value = bool(regex)
            if search is not None:
                self.search.value = search
        finally:
            self._quiet = False
        self._apply_filters()
        return self

    def reload(self) -> int:
        """Read the lines the run wrote since the last read (a run still going). Returns how many rows came."""
        new, stale = self._reader.read_new()
        if stale:  # a progress bar's earlier state, replaced by what came now
            self._all_rows = [row for row in self._all_rows if row[0] not in stale]
        if new:
            self._all_rows.extend(new)
            self._update_options()
        at_end = self._page == self.page_count
        self._refresh_summary()
        self._apply_filters(keep_page=True)
        if at_end:
            self._page = self.page_count
            self._render()
        return len(new)

    def event(self, line: int) -> dict:
        """The whole record at line ``line`` of events.jsonl (as RunLog wrote it)."""
        with open(self.events_path, encoding="utf-8", errors="replace") as source:
            for number, text in enumerate(source, 1):
                if number == line:
                    return json.loads(text)
        raise IndexError(f"events.jsonl of run {self.run_id} has no line {line}")

    @property
    def run_id(self) -> str:
        return self.summary.get("run_id") or os.path.basename(os.path.normpath(self.run_dir))

    # ---- internals

    @staticmethod
    def _choices(value: Any, control: widgets.SelectMultiple) -> tuple:
        values = tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else (value,)
        known = {option[1] for option in control.options}
        unknown = [item for item in values if item not in known]
        if unknown:
            raise ValueError(f"{control.description}={unknown!r} is not in this run; it has "
                             f"{[option[1] for option in control.options]}")
        return values

    def _update_options(self) -> None:
        ranks = sorted({row[_RANK] for row in self._all_rows} | set(self._summary_ranks()))
        kinds = {row[_KIND] for row in self._all_rows}
        ordered = [kind for kind in KIND_ORDER if kind in kinds] + sorted(kinds.difference(KIND_ORDER))
        was_quiet, self._quiet = self._quiet, True
        try:
            for control, options in ((self.rank_filter, [(f"rank {rank}", rank) for rank in ranks]),
                                     (self.kind_filter, [(kind, kind) for kind in ordered])):
                options = [(ALL, ALL)] + options
                if list(control.options) != options:
                    chosen = control.value
                    control.options = options
                    valid = {option[1] for option in options}
                    control.value = tuple(item for item in chosen if item in valid) or (ALL,)
                elif not control.value:
                    control.value = (ALL,)
        finally:
            self._quiet = was_quiet

    def _summary_ranks(self) -> list[int]:
        count = (self.run.world_size if self.run is not None else None) or self.summary.get("world_size")
        return list(range(count)) if isinstance(count, int) and count < 4096 and not self._all_rows else []

    def _on_choice(self, change: dict) -> None:
        """'all' and particular values exclude each other: picking one drops the other."""
        new, old = tuple(change["new"]), tuple(change["old"])
        if ALL in new and len(new) > 1:
            fixed = (ALL,) if ALL not in old else tuple(item for item in new if item != ALL)
            was_quiet, self._quiet = self._quiet, True
            try:
                change["owner"].value = fixed
            finally:
                self._quiet = was_quiet
        self._on_filter(change)

    def _on_filter(self, _change: dict | None = None) -> None:
        if not self._quiet:
            self._apply_filters()

    @staticmethod
    def _selected(values: tuple) -> set | None:
        return None if not values or ALL in values else set(values)

    def _apply_filters(self, keep_page: bool = False) -> None:
        started = time.perf_counter()
        rows = self._all_rows
        self._error = ""
        ranks = self._selected(self.rank_filter.value)
        if ranks is not None:
            rows = [row for row in rows if row[_RANK] in ranks]
        kinds = self._selected(self.kind_filter.value)
        if kinds is not None:
            rows = [row for row in rows if row[_KIND] in kinds]
        level = self.level_filter.value or 0
        if level:
            rows = [row for row in rows if row[_LEVELNO] >= level or row[_KIND] != "log"]
        needle = self.search.value
        if needle:
            if self.regex.value:
                try:
                    search = re.compile(needle, re.IGNORECASE).search
                except re.error as exc:
                    self._error = f"invalid regular expression: {exc}"
                    rows = []
                else:
                    rows = [row for row in rows if search(row[_TEXT]) or (row[_DETAIL] and search(row[_DETAIL]))]
            else:
                lowered = needle.lower()
                rows = [row for row in rows if lowered in row[_HAYSTACK]]
        self._rows = rows
        self._lines = [row[0] for row in rows]
        self.filter_seconds = time.perf_counter() - started
        if not keep_page:
            self._page = 1
            self._target_line = None
        self._page = min(self._page, self.page_count)
        self._render()

    def _highlighter(self):
        needle = self.search.value
        if not needle or self._error:
            return None
        try:
            return re.compile(needle if self.regex.value else re.escape(needle), re.IGNORECASE)
        except re.error:
            return None

    def _render(self) -> None:
        mark = self._highlighter()
        parts = [('<table style="border-collapse:collapse;font-family:var(--jp-code-font-family,monospace);'
                 'font-size:12px;line-height:1.35;width:100%">'),
                 (f'<tr style="color:#777;text-align:left"><th style="{_CELL}">line</th><th style="{_CELL};text-align:right">'
                 f'time</th><th style="{_CELL}">rank</th><th style="{_CELL}">kind</th>'
                 f'<th style="{_TEXT_CELL};width:100%">text</th></tr>')]
        for row in self.page_rows:
            color = _LEVEL_COLORS.get(row.levelno) if row.kind == "log" else _KIND_COLORS.get(row.kind)
            style = f"color:{color};" if color else ""
            if row.line == self._target_line:
                style += "background:#fff3b0;"
            text = _cut(row.text)
            body = _marked(text, mark)
            if row.detail:
                body = (f"<details><summary>{body}</summary>"
                        f"<div style=\"color:#444\">{_marked(_cut(row.detail, 20 * MAX_SHOWN_CHARS), mark)}</div>"
                        "</details>")
            parts.append(f'<tr style="{style}"><td style="{_CELL};color:#999">{row.line}</td>'
                         f'<td style="{_CELL};text-align:right">{_elapsed(row.time)}</td><td style="{_CELL}">{row.rank}</td>'
                         f'<td style="{_CELL}">{html.escape(row.level or row.kind)}</td>'
                         f'<td style="{_TEXT_CELL}">{body}</td></tr>')
        if not self._rows:
            parts.append(f'<tr><td colspan="5" style="color:#777;padding:6px">'
                         f'{"no events in this run log yet" if not self._all_rows else "no row passes the filters"}'
                         '</td></tr>')
        parts.append("</table>")
        self.content.value = "".join(parts)
        self.page_label.value = (f"&nbsp;page {self._page:,} of {self.page_count:,}&nbsp;")
        at_start, at_end = self._page <= 1, self._page >= self.page_count
        self.first_button.disabled = self.previous_button.disabled = at_start
        self.next_button.disabled = self.last_button.disabled = at_end
        self._set_status()

    def _set_status(self, note: str = "") -> None:
        shown = f"{len(self._rows):,} of {_count(len(self._all_rows), 'row')}"
        text = f"{shown} (filtered in {self.filter_seconds * 1000:.0f} ms)"
        if self._error:
            text += f" &middot; <span style=\"color:#c00000\">{html.escape(self._error)}</span>"
        if note:
            text += f" &middot; {html.escape(note)}"
        self.status.value = f'<span style="color:#555">{text}</span>'

    def _refresh_summary(self) -> None:
        summary = _read_summary(self.run_dir)
        run = self.run
        if run is not None:
            for key in ("run_id", "status", "device", "backend", "start_method", "num_processes", "world_size",
                        "attempts"):
                if getattr(run, key, None) is not None and (key not in summary or key == "status"):
                    summary[key] = getattr(run, key)
            if "duration_s" not in summary and getattr(run, "duration", 0):
                summary["duration_s"] = round(run.duration, 4)
        self.summary = summary
        self.header.value = self._header_html()

    @property
    def header_text(self) -> str:
        """The header line as plain text."""
        summary, reader = self.summary, self._reader
        ranks = sorted({row[_RANK] for row in self._all_rows})
        world = summary.get("world_size") or len(ranks)
        parts = [f"run {self.run_id}", str(summary.get("status") or "no summary yet (running, or stopped "
                                                                      "before it wrote run.json)")]
        parts.append(f"{_count(world, 'rank')}" + (f" ({summary['num_processes']} on this node)"
                                                   if summary.get("num_processes") not in (None, world) else ""))
        if summary.get("device"):
            parts.append(f"{summary['device']}/{summary.get('backend')}"
                         + (f" ({summary['start_method']})" if summary.get("start_method") else ""))
        if summary.get("duration_s") is not None:
            parts.append(f"{summary['duration_s']:.2f} s" if isinstance(summary["duration_s"], (int, float))
                         else f"{summary['duration_s']} s")
        if (summary.get("attempts") or 1) > 1:
            parts.append(f"{summary['attempts']} attempts")
        parts.append(_count(reader.events, "event"))
        if reader.unreadable:
            parts.append(f"{_count(reader.unreadable, 'unreadable line')}")
        text = "  ·  ".join(parts)
        cause = summary.get("root_cause")
        if isinstance(cause, dict) and cause.get("type"):
            text += f"\nroot cause: rank {cause.get('rank')} {cause['type']}: {first_line(cause.get('message'))}"
        return text

    def _header_html(self) -> str:
        first, _, cause = self.header_text.partition("\n")
        status = self.summary.get("status")
        color = {"finished": "#2e7d32", "running": "#1f5fa8", None: "#1f5fa8"}.get(status, "#c00000")
        name, _, rest = first.partition("  ·  ")
        status, _, rest = rest.partition("  ·  ")
        out = (f"<b>{html.escape(name)}</b> &middot; <b style=\"color:{color}\">{html.escape(status)}</b> &middot; "
               f"{html.escape(rest).replace('  ·  ', ' &middot; ')}")
        if cause:
            out += f"<br><span style=\"color:#c00000\">{html.escape(cause)}</span>"
        return f'<div style="font-size:13px">{out}</div>'

    def close(self) -> None:
        """Close the panel and its controls and let go of the rows (ipywidgets keeps every open widget)."""
        if not hasattr(self, "_boxes"):
            return  # the constructor raised (no such run): nothing was made
        for child in (self.header, self.rank_filter, self.kind_filter, self.level_filter, self.search, self.regex,
                      self.first_button, self.previous_button, self.next_button, self.last_button, self.page_label,
                      self.line_box, self.go_button, self.reload_button, self.status, self.content, *self._boxes):
            child.close()
        self._all_rows, self._rows, self._lines = [], [], []
        super().close()

    def __repr__(self) -> str:
        return f"<RunInspector {self.header_text.splitlines()[0]}; {len(self._rows):,} rows pass the filters>"


def _levelno(level: Any) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelName(str(level).upper())
    if str(level).lower() in ("all", "all levels"):
        return 0
    if not isinstance(number, int):
        raise ValueError(f"level={level!r}: expected DEBUG, INFO, WARNING, ERROR, CRITICAL or a number")
    return number


def _cut(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} … ({len(text) - limit:,} more characters; inspector.event(line) has it all)"


def _marked(text: str, mark: re.Pattern | None) -> str:
    """The text, HTML-escaped, with the search matches in <mark>."""
    if mark is None:
        return html.escape(text)
    out, position = [], 0
    for match in mark.finditer(text):
        if match.end() == match.start():
            continue
        out.append(html.escape(text[position:match.start()]))
        out.append(f"<mark>{html.escape(match.group())}</mark>")
        position = match.end()
    out.append(html.escape(text[position:]))
    return "".join(out)


def inspect_run(run: Any = None, *, rank: Any = None, kind: Any = None, level: Any = None,
                search: str | None = None, regex: bool = False, page_size: int = PAGE_SIZE) -> RunInspector:
    """A panel to browse a run's whole log: filter by rank, log level, kind and text, one page at a time.

    ``run`` is a ``Run`` (``last_run()``), the ``RankFailedError``/``LaunchTimeoutError`` a launch raised, a run
    id (or a unique part of one) from the run log folder (``$NOTEBOOK_LAUNCHER_RUNS_DIR`` or ``~/.cache/notebook_launcher/runs``), a
    run directory, or None: the last run of this kernel, else the newest run log on disk (after a restart).
    It reads ``events.jsonl``, every event of the run (the ``Run`` in memory keeps only so many lines), and
    shows it a page (``page_size`` rows) at a time, so a run of millions of lines is fine in the browser.

    Optional first filters: ``rank`` (one rank or several), ``kind`` ("stdout", "stderr", "log", "failure",
    "exit", "launcher", "progress", "oom_retry", ...), ``level`` (the lowest level of log records shown:
    "DEBUG" ... "CRITICAL"; output lines are not affected), ``search`` (case-insensitive text; a regular
    expression with ``regex=True``). The panel's controls change them; so does Python::

        from notebook_launcher import inspect_run, notebook_launcher

        notebook_launcher(train, num_processes=4)
        panel = inspect_run(rank=3, level="WARNING")   # the last run: rank 3's output and warnings
        panel                                          # shows it in the cell
        panel.search.value = "nan"                     # only the rows that mention nan
        panel.rows[:5], panel.page_count, panel.go_to_line(1200)
        inspect_run("20250101-120000-4242-a1b2c3")     # a past run, by id (or its directory)

    Raises ``RunNotFoundError`` (a LookupError) naming the argument and listing recent run ids when the run
    cannot be found. A run still going: the panel's reload button (or ``panel.reload()``) reads what it wrote
    since.
    """
    inspector = RunInspector(run, page_size=page_size)
    if any(value is not None for value in (rank, kind, level, search)) or regex:
        inspector.filter(rank=rank, kind=kind, level=level, search=search, regex=regex or None)
    return inspector


def _icon_button(icon: str, tooltip: str):
    return widgets.Button(icon=icon, tooltip=tooltip, layout=widgets.Layout(width="40px"))
