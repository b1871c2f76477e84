"""What a saved notebook shows of an inspector: a static summary of the run, as text/html and text/plain.

ipywidgets keeps a widget's state in the kernel, not in the notebook: reopened (or shown by GitHub, nbviewer,
nbconvert), the inspector's output reads "Error displaying widget: model not found" in JupyterLab, whose widget
renderer has no fallback to another type of the same output. So ``RunInspector`` is shown as two outputs: this
summary, then the widget. The summary's HTML carries a style for JupyterLab's (and Notebook 7's) output area
that hides the summary while the widget right after it is drawn, and hides the widget's output when its model is
gone ("model not found"): live, the panel; reopened, the summary. Where that style does not apply (a
notebook not trusted, other frontends) both are shown. No widgets here.
"""

from __future__ import annotations

import html
import logging

from ..schema.events import EXIT, FAILURE, LOG
from .logview import LogView, count

WIDGET_CLASS = "nl-inspector"  # the widget's CSS class
SAVED_CLASS = "nl-inspector-saved"  # the summary's
MAX_RANKS = 16  # rank rows in the summary; the others are counted in one line
# The widget renderer's "Error displaying widget: model not found" is a text in an output node of this class (a
# drawn widget's node has not the class; and a :has() cannot hold another, so the panel is excluded outside it).
_WIDGET_ERROR = ".jp-OutputArea-child:has(> .jp-OutputArea-output.jupyter-widgets)"
_STYLE = (f"<style>.jp-OutputArea-child:has(.{SAVED_CLASS}):has(+ .jp-OutputArea-child .{WIDGET_CLASS})"
          "{display:none}"
          f".jp-OutputArea-child:has(.{SAVED_CLASS}) + {_WIDGET_ERROR}:not(:has(.{WIDGET_CLASS})){{display:none}}"
          "</style>")
_MONO = "font-family:var(--jp-code-font-family,monospace),monospace"
_CELL = "padding:0 12px 0 0;text-align:left;vertical-align:top"
_STATUS_COLORS = {"finished": "#2e7d32", "running": "#1f5fa8", None: "#1f5fa8"}


def rank_counts(view: LogView) -> list[tuple[int, int, int, int, str]]:
    """Per rank: (rank, output lines, warnings, errors, how it ended). Errors are log records at ERROR and above
    and failures; warnings, log records at WARNING; the end is the rank's last exit row ("" while it runs)."""
    table = {rank: [0, 0, 0, ""] for rank in view.rank_options}
    for row in view.all_rows:
        counts = table.setdefault(row.rank, [0, 0, 0, ""])
        if row.kind in ("stdout", "stderr"):
            counts[0] += 1
        elif row.kind == LOG and row.levelno >= logging.ERROR or row.kind == FAILURE:
            counts[2] += 1
        elif row.kind == LOG and row.levelno >= logging.WARNING:
            counts[1] += 1
        elif row.kind == EXIT:
            counts[3] = row.text
    return [(rank, *counts) for rank, counts in table.items()]  # the run's ranks in order, then any other


def header_html(view: LogView) -> str:
    """The header line: run id, status (coloured), ranks, device, duration, events; the root cause below."""
    first, _, cause = view.header_text.partition("\n")
    color = _STATUS_COLORS.get(view.summary.get("status"), "#c00000")
    name, _, rest = first.partition("  ·  ")
    status, _, rest = rest.partition("  ·  ")
    out = (f"<b>{html.escape(name)}</b> &middot; <b style=\"color:{color}\">{html.escape(status)}</b> &middot; "
           f"{html.escape(rest).replace('  ·  ', ' &middot; ')}")
    if cause:
        out += f"<br><span style=\"color:#c00000\">{html.escape(cause).replace(chr(10), '<br>')}</span>"
    return f'<div style="font-size:13px">{out}</div>'


def saved_summary_bundle(view: LogView) -> dict:
    """The summary as a display bundle: text/html (with the style above) and text/plain."""
    ranks = rank_counts(view)
    shown, rest = ranks[:MAX_RANKS], ranks[MAX_RANKS:]
    plain = [view.header_text, ""]
    plain += [f"rank {rank}: {count(lines, 'output line')}, {count(warnings, 'warning')}, {count(errors, 'error')}"
              + (f", {end}" if end else "") for rank, lines, warnings, errors, end in shown]
    rows = "".join(
        f'<tr><td style="{_CELL}">{html.escape(str(rank))}</td><td style="{_CELL}">{lines:,}</td>'
        f'<td style="{_CELL};{"color:#b35900" if warnings else ""}">{warnings:,}</td>'
        f'<td style="{_CELL};{"color:#c00000" if errors else ""}">{errors:,}</td>'
        f'<td style="{_CELL}">{html.escape(end)}</td></tr>' for rank, lines, warnings, errors, end in shown)
    if rest:
        more = (f"and {count(len(rest), 'more rank')}: {count(sum(r[2] for r in rest), 'warning')}, "
                f"{count(sum(r[3] for r in rest), 'error')}")
        plain.append(more)
        rows += f'<tr><td colspan="5" style="{_CELL};color:#555">{html.escape(more)}</td></tr>'
    head = "".join(f'<th style="{_CELL};font-weight:normal;color:#777">{name}</th>'
                   for name in ("rank", "output lines", "warnings", "errors", "end"))
    plain += ["", "A saved summary of the run log: the inspector's panel lived in the kernel that showed it. "
                  f"inspect_run({view.run_id!r}) browses the whole log again."]
    code = f'<code style="{_MONO}">inspect_run({html.escape(repr(view.run_id))})</code>'
    page = (f'{_STYLE}<div class="{SAVED_CLASS}" style="border:1px solid #ddd;padding:6px 8px;text-align:left">'
            f'{header_html(view)}'
            f'<table style="border-collapse:collapse;margin:6px 0;font-size:12px;{_MONO}">'
            f'<tr>{head}</tr>{rows}</table>'
            f'<div style="color:#555;font-size:12px">A saved summary of the run log: the inspector&#39;s panel '
            f'lived in the kernel that showed it. {code} browses the whole log again.</div></div>')
    return {"text/html": page, "text/plain": "\n".join(plain)}
