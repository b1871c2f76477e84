"""Browse a whole run log in the notebook: every line of every rank, filtered and paged.

The cell that launched a run shows what the ranks printed as it arrived, mixed together, and the ``Run`` keeps
only so many lines in memory. When a run has printed a hundred thousand lines, or failed an hour ago, or in a
kernel that has been restarted since, the question is "what did rank 3 log at WARNING and above just before it
died?". ``inspect_run()`` answers it from the run log on disk (``events.jsonl``, written by ``RunLog``), the
whole run, in an ipywidgets panel: filter by rank, level (log records at a level and above, or one click for
"errors and warnings"), kind of event and text (substring or regex), one page of rows at a time (the browser never
holds more than a page, so a huge log does not freeze it). Rows are numbered in the order of the run ("#").

ipywidgets' state is not saved with a notebook: reopened, a widget's output reads "model not found". So the panel
is shown with a static summary of the run just before it (``inspector_saved.py``), which a saved notebook keeps.

This module is the widget only: the rows, filters and pages are a ``LogView`` (``logview.py``, no widgets),
read from the log by ``logreader.py``. Everything the panel shows is reachable from Python
(``inspector.rows``, ``inspector.page``, ``inspector.page_text``), so it can be driven and tested without a
browser.
"""

from __future__ import annotations

import html
import logging
import re
from typing import Any

import ipywidgets as widgets

from ..schema.events import EXIT, FAILURE, LAUNCHER, LOG, OOM_RETRY, PROGRESS, SHAPE_MISMATCH, STATUS, TRIGGER
from .inspector_saved import WIDGET_CLASS, header_html, saved_summary_bundle
from .logreader import Row
from .logview import (
    ALL,
    ERRORS_AND_WARNINGS,
    LEVEL_HELP,
    LEVELS,
    MAX_SHOWN_CHARS,
    PAGE_SIZE,
    LogView,
    count,
    elapsed,
    levelno,
)
from .logview import cut as _cut

__all__ = ["Row", "RunInspector"]

_KIND_COLORS = {"stderr": "#b35900", FAILURE: "#c00000", EXIT: "#555", STATUS: "#555", LAUNCHER: "#1f5fa8",
                OOM_RETRY: "#b35900", SHAPE_MISMATCH: "#c00000", TRIGGER: "#6a3d9a", PROGRESS: "#2e7d32"}
_LEVEL_COLORS = {logging.WARNING: "#b35900", logging.ERROR: "#c00000", logging.CRITICAL: "#c00000"}
_CELL = "padding:0 8px 0 0;vertical-align:top;white-space:nowrap"
_TEXT_CELL = "padding:0;vertical-align:top;white-space:pre-wrap;word-break:break-all"


class RunInspector(widgets.VBox):
    """A panel over one run's log: filters (rank, log level, kind, text), one page of rows at a time.

    Python API (setting a control's value filters at once; ``view`` is the ``LogView`` underneath):

    - ``rank_filter.value``: a tuple of ranks, or ``("all",)``; ``kind_filter.value``: a tuple of kinds
      ("stdout", "stderr", "log", "failure", ...), or ``("all",)``; ``level_filter.value``: 0 for every row, a
      level number for log records at that level and above only (output lines and progress rows are hidden), or
      "errors and warnings" (``errors_button`` sets it in one click; ``logview.is_error_or_warning`` says what it
      keeps); ``search.value``: text, case-insensitive, a substring or, with ``regex.value = True``, a regular
      expression. ``filter(...)`` sets several at once.
    - ``rows``: the rows that pass the filters (``Row`` tuples); ``all_rows``: every row.
    - ``page`` (1-based, clamped) of ``page_count``, ``page_size``; ``page_rows``; ``first_page()``,
      ``previous_page()``, ``next_page()``, ``last_page()``; ``go_to_line(n)``: the page with row n (the "#"
      column: the n-th row of the run, whatever the filters; or the next row the filters keep).
    - ``page_html`` (what the panel shows) and ``page_text`` (the same rows as plain text).
    - ``reload()``: read what a running run wrote since; ``row(n)``: row n; ``event(row.line)``: its full record.
    - ``saved_summary``: the static summary shown above the panel, which a saved notebook keeps.
    """

    def __init__(self, run_dir: str, run: Any = None, *, page_size: int = PAGE_SIZE):
        self.view = LogView(run_dir, run, page_size=page_size)
        self._quiet = False  # set while several controls change at once: one filter at the end

        self.header = widgets.HTML()
        self.rank_filter = widgets.SelectMultiple(description="rank", rows=4,
                                                  layout=widgets.Layout(width="170px"))
        self.kind_filter = widgets.SelectMultiple(description="kind", rows=4,  # rows: as many as kinds (below)
                                                  layout=widgets.Layout(width="230px"))
        # (ipywidgets 8 shows a select's tooltip only when it has no description: the label is a widget of its own)
        self.level_label = widgets.HTML(f'<span title="{html.escape(LEVEL_HELP)}">level</span>',
                                        layout=widgets.Layout(width="80px", justify_content="flex-end",
                                                              margin="0 4px 0 0"))
        self.level_filter = widgets.Dropdown(options=LEVELS, value=0, tooltip=LEVEL_HELP,
                                             layout=widgets.Layout(width="180px"))
        self.errors_button = widgets.ToggleButton(value=False, description="errors and warnings",
                                                  icon="exclamation-triangle", tooltip=LEVEL_HELP,
                                                  layout=widgets.Layout(width="190px"))
        self.search = widgets.Text(placeholder="search (case-insensitive)", description="search",
                                   continuous_update=True, layout=widgets.Layout(width="320px"))
        self.regex = widgets.Checkbox(value=False, description="regex", indent=False,
                                      layout=widgets.Layout(width="80px"))
        self.first_button = _icon_button("angle-double-left", "first page")
        self.previous_button = _icon_button("angle-left", "previous page")
        self.next_button = _icon_button("angle-right", "next page")
        self.last_button = _icon_button("angle-double-right", "last page")
        self.page_label = widgets.HTML()
        self.line_box = widgets.BoundedIntText(value=1, min=1, max=10**12, description="row #",
                                               tooltip="a row's number in the run (the # column)",
                                               layout=widgets.Layout(width="170px"))
        self.go_button = widgets.Button(description="go", tooltip="show the page with this row (the # column)",
                                        layout=widgets.Layout(width="50px"))
        self.reload_button = _icon_button("refresh", "read what the run wrote since")
        self.status = widgets.HTML()
        self.content = widgets.HTML(layout=widgets.Layout(max_height="520px", overflow="auto",
                                                          border="1px solid #ddd", padding="2px 4px"))

        self.header.value = self._header_html()
        self._update_options()
        self.rank_filter.observe(self._on_choice, names="value")
        self.kind_filter.observe(self._on_choice, names="value")
        for control in (self.level_filter, self.search, self.regex):
            control.observe(self._on_filter, names="value")
        self.errors_button.observe(self._on_errors_button, names="value")
        self.first_button.on_click(lambda _: self.first_page())
        self.previous_button.on_click(lambda _: self.previous_page())
        self.next_button.on_click(lambda _: self.next_page())
        self.last_button.on_click(lambda _: self.last_page())
        self.go_button.on_click(lambda _: self.go_to_line(self.line_box.value))
        self.line_box.observe(lambda change: self.go_to_line(change["new"]), names="value")  # on Enter
        self.reload_button.on_click(lambda _: self.reload())

        search_box = widgets.HBox([self.search, self.regex])
        level_box = widgets.HBox([self.level_label, self.level_filter, self.errors_button],
                                 layout=widgets.Layout(align_items="center"))
        right = widgets.VBox([level_box, search_box])
        filters = widgets.HBox([self.rank_filter, self.kind_filter, right])
        pager = widgets.HBox([self.first_button, self.previous_button, self.page_label, self.next_button,
                              self.last_button, self.line_box, self.go_button, self.reload_button],
                             layout=widgets.Layout(align_items="center"))
        self._boxes = (search_box, level_box, right, filters, pager)
        super().__init__([self.header, filters, pager, self.status, self.content])
        self.add_class(WIDGET_CLASS)  # what the saved summary's style looks for (inspector_saved.py)
        self._saved_display: Any = None  # the display handle of the saved summary, once shown
        self._apply_filters()

    # ---- state: the view's

    run_dir = property(lambda self: self.view.run_dir)
    run = property(lambda self: self.view.run)
    events_path = property(lambda self: self.view.events_path)
    summary = property(lambda self: self.view.summary)
    run_id = property(lambda self: self.view.run_id)
    load_seconds = property(lambda self: self.view.load_seconds)
    filter_seconds = property(lambda self: self.view.filter_seconds)
    _reader = property(lambda self: self.view.reader)

    @property
    def all_rows(self) -> list[Row]:
        return self.view.all_rows

    @property
    def rows(self) -> list[Row]:
        """The rows that pass the filters, in the order of the run log."""
        return self.view.rows

    @property
    def page_size(self) -> int:
        return self.view.page_size

    @page_size.setter
    def page_size(self, value: int) -> None:
        self.view.page_size = value
        self._render()

    @property
    def page_count(self) -> int:
        return self.view.page_count

    @property
    def page(self) -> int:
        """The page shown, from 1 to page_count."""
        return self.view.page

    @page.setter
    def page(self, value: int) -> None:
        self.view.page = value
        self._render()

    @property
    def page_rows(self) -> list[Row]:
        return self.view.page_rows

    @property
    def page_html(self) -> str:
        return self.content.value

    @property
    def page_text(self) -> str:
        """The rows of the page as plain text: ``#  time  [rank r]  kind  text`` (# the row's number)."""
        return self.view.page_text

    @property
    def error(self) -> str:
        """Why the last filter could not apply (an invalid regex), else ""."""
        return self.view.error

    @property
    def header_text(self) -> str:
        """The header line as plain text."""
        return self.view.header_text

    def event(self, line: int) -> dict:
        """The whole record at line ``line`` of events.jsonl (as RunLog wrote it): ``event(row.line)``."""
        return self.view.event(line)

    def row(self, number: int) -> Row | None:
        """Row ``number`` (the "#" column) of the run, whatever the filters; None when there is none."""
        return self.view.row(number)

    @property
    def saved_summary(self) -> dict:
        """The static summary of the run (text/html and text/plain) shown above the panel and saved with the
        notebook: what a reopened notebook shows in place of the panel, whose state is not saved."""
        return saved_summary_bundle(self.view)

    def _ipython_display_(self, **kwargs: Any) -> None:
        """The saved summary, then the panel: a reopened notebook shows the summary (the panel's model is gone);
        while the panel is there the summary's own style hides it."""
        from IPython.display import display

        self._saved_display = display(self.saved_summary, raw=True, display_id=True)
        display(self._repr_mimebundle_(**kwargs), raw=True)

    # ---- actions

    def first_page(self) -> None:
        self.page = 1

    def previous_page(self) -> None:
        self.page = self.view.page - 1

    def next_page(self) -> None:
        self.page = self.view.page + 1

    def last_page(self) -> None:
        self.page = self.page_count

    def go_to_line(self, number: int) -> Row | None:
        """Show the page holding row ``number`` (the "#" column), or the first row after it that the filters keep;
        that row is marked. Returns it (None when no row at or after it passes the filters)."""
        row = self.view.go_to_line(number)
        if row is None:
            self._set_status(f"no row at or after row {int(number):,} passes the filters")
        else:
            self._render()
        return row

    def filter(self, rank: Any = None, kind: Any = None, level: Any = None, search: str | None = None,
               regex: bool | None = None) -> RunInspector:
        """Set several filters at once (one pass over the rows). ``rank``/``kind``: one value or several
        ("all" for all); ``level``: a level name or number; None leaves a filter as it is."""
        self._quiet = True
        try:
            if rank is not None:
                self.rank_filter.value = self.view.choice("rank", rank)
            if kind is not None:
                self.kind_filter.value = self.view.choice("kind", kind)
            if level is not None:
                self.level_filter.value = levelno(level)
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
        came = self.view.reload()
        if came:
            self._update_options()
        self.header.value = self._header_html()
        self._render()
        if self._saved_display is not None:  # what a saved notebook keeps: the run as it is now
            self._saved_display.update(self.saved_summary, raw=True)
        return came

    # ---- internals

    def _update_options(self) -> None:
        """The rank and kind controls list what the run has; what was chosen stays chosen."""
        was_quiet, self._quiet = self._quiet, True
        try:
            for control, options in ((self.rank_filter, [(f"rank {rank}", rank) for rank in self.view.rank_options]),
                                     (self.kind_filter, [(kind, kind) for kind in self.view.kind_options])):
                options = [(ALL, ALL)] + options
                # every kind in sight (a run has a dozen at most); ranks: a scrolled list past 8
                control.rows = len(options) if control is self.kind_filter else min(max(len(options), 4), 9)
                if list(control.options) != options:
                    chosen = control.value
                    control.options = options
                    valid = {option[1] for option in options}
                    control.value = tuple(item for item in chosen if item in valid) or (ALL,)
                elif not control.value:
                    control.value = (ALL,)
        finally:
            self._quiet = was_quiet

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
        was_quiet, self._quiet = self._quiet, True
        try:  # the shortcut button shows whether the level is "errors and warnings"
            self.errors_button.value = self.level_filter.value == ERRORS_AND_WARNINGS
        finally:
            self._quiet = was_quiet
        if not self._quiet:
            self._apply_filters()

    def _on_errors_button(self, change: dict) -> None:
        """One click: errors and warnings; a second: every row again."""
        if self._quiet:
            return
        self.level_filter.value = ERRORS_AND_WARNINGS if change["new"] else 0

    def _apply_filters(self) -> None:
        """What the controls say, to the view; then the page."""
        self.view.set_filters(ranks=self.rank_filter.value, kinds=self.kind_filter.value,
                              level=self.level_filter.value or 0, search=self.search.value, regex=self.regex.value)
        self._render()

    def _render(self) -> None:
        view = self.view
        self.content.value = _page_html(view.page_rows, view.highlighter(), view.target_line,
                                        "no events in this run log yet" if not view.all_rows
                                        else "no row passes the filters" if not view.rows else "")
        self.page_label.value = f"&nbsp;page {view.page:,} of {view.page_count:,}&nbsp;"
        at_start, at_end = view.page <= 1, view.page >= view.page_count
        self.first_button.disabled = self.previous_button.disabled = at_start
        self.next_button.disabled = self.last_button.disabled = at_end
        self._set_status()

    def _set_status(self, note: str = "") -> None:
        view = self.view
        text = (f"{len(view.rows):,} of {count(len(view.all_rows), 'row')} "
                f"(filtered in {view.filter_seconds * 1000:.0f} ms)")
        if view.level == ERRORS_AND_WARNINGS:
            text += " &middot; errors and warnings (log records at WARNING and above, failures, exits, stderr errors)"
        elif view.level:
            text += (f" &middot; log records at {html.escape(logging.getLevelName(view.level))} and above only: "
                     "output lines and progress rows hidden")
        if view.error:
            text += f" &middot; <span style=\"color:#c00000\">{html.escape(view.error)}</span>"
        if note:
            text += f" &middot; {html.escape(note)}"
        self.status.value = f'<span style="color:#555">{text}</span>'

    def _header_html(self) -> str:
        return header_html(self.view)

    def close(self) -> None:
        """Close the panel and its controls and let go of the rows (ipywidgets keeps every open widget)."""
        if not hasattr(self, "_boxes"):
            return  # the constructor raised (no such run): nothing was made
        for child in (self.header, self.rank_filter, self.kind_filter, self.level_label, self.level_filter,
                      self.errors_button,
                      self.search, self.regex,
                      self.first_button, self.previous_button, self.next_button, self.last_button, self.page_label,
                      self.line_box, self.go_button, self.reload_button, self.status, self.content, *self._boxes):
            child.close()
        self.view.all_rows, self.view.rows = [], []
        super().close()

    def __repr__(self) -> str:
        return f"<RunInspector {self.header_text.splitlines()[0]}; {len(self.rows):,} rows pass the filters>"


def _page_html(rows: list[Row], mark: re.Pattern | None, target_line: int | None, empty: str) -> str:
    """One page of rows as an HTML table: every text escaped, the search marked, the target line highlighted."""
    parts = [('<table style="border-collapse:collapse;font-family:var(--jp-code-font-family,monospace);'
             'font-size:12px;line-height:1.35;width:100%">'),
             (f'<tr style="color:#777;text-align:left"><th style="{_CELL}" title="the row\'s number in the run, '
              f'whatever the filters">#</th>'
              f'<th style="{_CELL};text-align:right">time</th><th style="{_CELL}">rank</th>'
              f'<th style="{_CELL}">kind</th><th style="{_TEXT_CELL};width:100%">text</th></tr>')]
    for row in rows:
        color = _LEVEL_COLORS.get(row.levelno) if row.kind == LOG else _KIND_COLORS.get(row.kind)
        style = f"color:{color};" if color else ""
        if row.number == target_line:
            style += "background:#fff3b0;"
        body = _marked(_cut(row.text), mark)
        if row.detail:
            body = (f"<details><summary>{body}</summary>"
                    f"<div style=\"color:#444\">{_marked(_cut(row.detail, 20 * MAX_SHOWN_CHARS), mark)}</div>"
                    "</details>")
        parts.append(f'<tr style="{style}"><td style="{_CELL};color:#999">{row.number}</td>'
                     f'<td style="{_CELL};text-align:right">{elapsed(row.time)}</td><td style="{_CELL}">{row.rank}</td>'
                     f'<td style="{_CELL}">{html.escape(row.level or row.kind)}</td>'
                     f'<td style="{_TEXT_CELL}">{body}</td></tr>')
    if empty:
        parts.append(f'<tr><td colspan="5" style="color:#777;padding:6px">{empty}</td></tr>')
    parts.append("</table>")
    return "".join(parts)


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


def _icon_button(icon: str, tooltip: str):
    return widgets.Button(icon=icon, tooltip=tooltip, layout=widgets.Layout(width="40px"))
