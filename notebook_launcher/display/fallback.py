"""The run panel for frontends without the JupyterLab extension: ``text/plain`` and a static ``text/html``.

Both are made from the same state payload as the panel (``RunState.to_json()``) and carry the same lines, so
whichever a frontend or exporter picks (``nbconvert --to markdown`` picks the HTML), nothing is missing (once
the saved output is cut to its budget, they carry the newest quarter of each rank's kept lines: ``budget.py``).
Everything that came from user code is escaped: the HTML is safe in untrusted notebooks.
"""

from __future__ import annotations

import html
import string

from ..schema.events import LOG, TRIGGER
from .describe import describe, launcher_line, log_line

_STATUS_COLOURS = {"starting": "#888", "running": "#1a73e8", "finished": "#188038", "failed": "#d93025",
                   "stuck": "#e37400", "hung": "#e37400", "timed out": "#e37400", "interrupted": "#888",
                   "waiting": "#e37400", "busy": "#e37400", "in DDP": "#e37400"}
_LEVEL_COLOURS = {"DEBUG": "#888", "WARNING": "#b06000", "ERROR": "#d93025", "CRITICAL": "#d93025"}


def headline(state: dict) -> str:
    world = state["world_size"]
    return (f"notebook_launcher run {state['run_id']}: {state['status']}, {world} rank{'s' if world != 1 else ''} "
            f"on {state['device']} ({state['backend']}, {state['start_method']}), {state['elapsed']:.1f} s"
            + (f", try {state['attempt']}" if state.get("attempt", 1) > 1 else "")
            + (f", batch size {state['batch_size']}" if state.get("batch_size") is not None else ""))


def _line_text(line: dict) -> str:
    if line["kind"] == LOG:
        return log_line(line.get("level"), line.get("logger"), line["text"])
    return line["text"]


def text_lines(state: dict, prefix_template: str = "[rank ${rank}] ") -> list[tuple[str, str | None]]:
    """The text display's lines for a state, each with a colour hint: header, notes, the root cause, then
    every rank's lines in arrival order, progress, cards, and each rank's status."""
    template = string.Template(prefix_template)
    out: list[tuple[str, str | None]] = [(headline(state), None)]
    out += [(launcher_line(note), "#666") for note in state["notes"]]
    out += hang_lines(state)
    failure = state.get("failure")
    if failure and failure.get("traceback"):
        out.append((f"root cause (rank {failure.get('rank')}):", _STATUS_COLOURS["failed"]))
        out += [(line, _STATUS_COLOURS["failed"]) for line in failure["traceback"].rstrip("\n").splitlines()]
    elif failure and failure.get("kind") in ("hang", "timeout"):
        out += [(line, _STATUS_COLOURS["stuck"]) for line in str(failure.get("message", "")).splitlines()]
    lines = []
    for rank in state["ranks"]:
        prefix = template.safe_substitute(rank=rank["rank"], local_rank=rank["rank"], role_name="default",
                                          node_rank=0)
        if rank["lines_dropped"]:
            lines.append((0, f"{prefix}({rank['lines_dropped']} earlier lines are in the run log: "
                             f"{state['run_dir']})", "#666"))
        for line in rank["lines"]:
            colour = _LEVEL_COLOURS.get(line.get("level")) or (_STATUS_COLOURS["failed"]
                                                               if line["kind"] == "stderr" else None)
            lines += [(line["n"], f"{prefix}{text}", colour) for text in _line_text(line).split("\n")]
        if rank.get("progress"):
            out.append((f"{prefix}{_progress_text(rank['progress'])}", None))
    out += [(text, colour) for _, text, colour in sorted(lines, key=lambda item: item[0])]
    for card in state["shape_mismatches"]:
        out.append((f"shape mismatch in {card['operation']}:", _STATUS_COLOURS["failed"]))
        out += [(f"  - Process {p['rank']}: {p['shape']} {p['dtype'] or ''} at {p['call_site']}".rstrip(), None)
                for p in card["processes"]]
    for retry in state["oom_retries"]:
        out.append((f"out of memory on rank {', '.join(map(str, retry['ranks']))} at batch size "
                    f"{retry['batch_size']} -> retried at {retry['new_batch_size']} ({retry['error']})",
                    _LEVEL_COLOURS["WARNING"]))
    for trigger in state["triggers"]:
        out.append((f"rank {trigger['rank']} called {describe(TRIGGER, trigger).text}", None))
    out.append(("status by rank: " + ", ".join(f"{r['rank']} {r['status']}" for r in state["ranks"]), None))
    return out


def hang_lines(state: dict) -> list[tuple[str, str | None]]:
    """A live hang notice as the text display printed it; earlier and cleared ones in one line each."""
    notices = [*(state.get("hangs") or []), *([state["hang"]] if state.get("hang") else [])]
    out = []
    for notice in notices:
        if notice.get("live"):
            out += [(line, _STATUS_COLOURS["stuck"]) for line in str(notice.get("text", "")).splitlines()]
            continue
        how = (f"cleared after {notice['cleared_after']:.0f} s" if notice.get("cleared_after") is not None
               else "cleared" if notice.get("cleared_t") is not None else "not cleared before the run ended")
        quiet = f", {notice['quiet_s']:.0f} s without progress" if notice.get("quiet_s") is not None else ""
        out.append((f"possible hang at {notice.get('t', 0):.1f} s{quiet}: {how}", "#666"))
    return out


def render_text(state: dict, prefix_template: str = "[rank ${rank}] ") -> str:
    """What a terminal shows: the text display's lines, in arrival order."""
    return "\n".join(text for text, _ in text_lines(state, prefix_template))


def _progress_text(progress: dict) -> str:
    step, total = progress.get("step"), progress.get("total")
    text = f"step {step}" + (f"/{total}" if total else "")
    metrics = ", ".join(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
                        for name, value in (progress.get("metrics") or {}).items())
    if progress.get("step_time"):
        text += f", {progress['step_time'] * 1000:.1f} ms/step"
    return text + (f", {metrics}" if metrics else "")


def render_html(state: dict, prefix_template: str = "[rank ${rank}] ") -> str:
    """A static snapshot for VS Code, nbviewer, GitHub and ``nbconvert --to markdown``: the text display's lines
    (every one of them, escaped), coloured, then the shape and out-of-memory tables."""
    e = html.escape
    rows = [f'<span style="color:{colour}">{e(text)}</span>' if colour else e(text)
            for text, colour in text_lines(state, prefix_template)]
    rows[0] = f"<b>{rows[0]}</b>"
    parts = ['<div class="nl-run-static">', f'<pre style="white-space:pre-wrap">{chr(10).join(rows)}</pre>']
    for card in state["shape_mismatches"]:
        cells = "".join(f"<tr><td>{e(str(p['rank']))}</td><td>{e(str(p['operation']))}</td>"
                        f"<td>{e(str(p['shape']))}</td>"
                        f"<td>{e(str(p['dtype']))}</td><td>{e(str(p['call_site']))}</td></tr>"
                        for p in card["processes"])
        parts.append(f'<table><caption>shape mismatch in {e(card["operation"])}</caption><tr><th>process</th>'
                     f'<th>operation</th><th>shape</th><th>dtype</th><th>call site</th></tr>{cells}</table>')
    if state["oom_retries"]:
        cells = "".join(f"<tr><td>{e(str(r['batch_size']))} &rarr; {e(str(r['new_batch_size']))}</td>"
                        f"<td>{e(', '.join(map(str, r['ranks'])))}</td><td>{e(r['error'])}</td></tr>"
                        for r in state["oom_retries"])
        parts.append(f"<table><caption>out-of-memory retries</caption><tr><th>batch size</th><th>ranks</th>"
                     f"<th>error</th></tr>{cells}</table>")
    parts.append("</div>")
    return "".join(parts)
