"""The run panel for frontends without the JupyterLab extension: ``text/plain`` and a static ``text/html``.

Both are made from the same state payload as the panel (``RunState.to_json()``). Everything that came from user
code is escaped: the HTML is safe in untrusted notebooks (and nbviewer/GitHub sanitize it anyway).
"""

from __future__ import annotations

import html
import string

_STATUS_COLOURS = {"starting": "#888", "running": "#1a73e8", "finished": "#188038", "failed": "#d93025",
                   "stuck": "#e37400", "hung": "#e37400", "timed out": "#e37400", "interrupted": "#888"}
_LEVEL_COLOURS = {"DEBUG": "#888", "WARNING": "#b06000", "ERROR": "#d93025", "CRITICAL": "#d93025"}


def headline(state: dict) -> str:
    world = state["world_size"]
    return (f"notebook_launcher run {state['run_id']}: {state['status']}, {world} rank{'s' if world != 1 else ''} "
            f"on {state['device']} ({state['backend']}, {state['start_method']}), {state['elapsed']:.1f} s"
            + (f", try {state['attempt']}" if state.get("attempt", 1) > 1 else "")
            + (f", batch size {state['batch_size']}" if state.get("batch_size") is not None else ""))


def _line_text(line: dict) -> str:
    if line["kind"] == "log":
        return f"{line.get('level')} {line.get('logger')}: {line['text']}"
    return line["text"]


def render_text(state: dict, prefix_template: str = "[rank ${rank}] ") -> str:
    """What a terminal or ``nbconvert --to markdown`` shows: the text display's lines, in arrival order."""
    template = string.Template(prefix_template)
    out = [headline(state)]
    out += [f"notebook_launcher: {note}" for note in state["notes"]]
    failure = state.get("failure")
    if failure and failure.get("traceback"):
        out += [f"root cause (rank {failure.get('rank')}):", *failure["traceback"].rstrip("\n").splitlines()]
    lines = []
    for rank in state["ranks"]:
        prefix = template.safe_substitute(rank=rank["rank"], local_rank=rank["rank"], role_name="default",
                                          node_rank=0)
        if rank["lines_dropped"]:
            lines.append((0, f"{prefix}({rank['lines_dropped']} earlier lines are in the run log: "
                             f"{state['run_dir']})"))
        for line in rank["lines"]:
            lines += [(line["n"], f"{prefix}{text}") for text in _line_text(line).split("\n")]
        if rank.get("progress"):
            out.append(f"{prefix}{_progress_text(rank['progress'])}")
    out += [text for _, text in sorted(lines, key=lambda item: item[0])]
    for card in state["shape_mismatches"]:
        out.append(f"shape mismatch in {card['operation']}:")
        out += [f"  - Process {p['rank']}: {p['shape']} {p['dtype'] or ''} at {p['call_site']}".rstrip()
                for p in card["processes"]]
    for retry in state["oom_retries"]:
        out.append(f"out of memory on rank {', '.join(map(str, retry['ranks']))} at batch size "
                   f"{retry['batch_size']} -> retried at {retry['new_batch_size']} ({retry['error']})")
    for trigger in state["triggers"]:
        out.append(f"rank {trigger['rank']} called set_trigger() at {trigger['call_site']}")
    out.append("status by rank: " + ", ".join(f"{r['rank']} {r['status']}" for r in state["ranks"]))
    return "\n".join(out)


def _progress_text(progress: dict) -> str:
    step, total = progress.get("step"), progress.get("total")
    text = f"step {step}" + (f"/{total}" if total else "")
    metrics = ", ".join(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
                        for name, value in (progress.get("metrics") or {}).items())
    if progress.get("step_time"):
        text += f", {progress['step_time'] * 1000:.1f} ms/step"
    return text + (f", {metrics}" if metrics else "")


def render_html(state: dict) -> str:
    """A static snapshot for VS Code, nbviewer, GitHub: header, failure first, one column per rank, cards."""
    e = html.escape
    colour = _STATUS_COLOURS.get(state["status"], "#888")
    parts = ['<div class="nl-run-static" style="font-family:monospace;font-size:12px">',
             f'<div><b>{e(headline(state))}</b> <span style="color:{colour}">&#9679;</span></div>']
    parts += [f'<div style="color:#666">{e(note)}</div>' for note in state["notes"]]
    failure = state.get("failure")
    if failure:
        parts.append(f'<details open><summary style="color:#d93025">{e(failure.get("kind", "failure"))}'
                     f'{" on rank " + str(failure["rank"]) if failure.get("rank") is not None else ""}</summary>'
                     f'<pre>{e(failure.get("traceback") or failure.get("message") or "")}</pre></details>')
    cells = []
    for rank in state["ranks"]:
        rows = []
        if rank["lines_dropped"]:
            rows.append(f'<i>{rank["lines_dropped"]} earlier lines are in the run log</i>')
        for line in rank["lines"]:
            style = f' style="color:{_LEVEL_COLOURS[line.get("level")]}"' if line.get("level") in _LEVEL_COLOURS \
                else (' style="color:#d93025"' if line["kind"] == "stderr" else "")
            rows.append(f"<span{style}>{e(_line_text(line))}</span>")
        progress = f"<div>{e(_progress_text(rank['progress']))}</div>" if rank.get("progress") else ""
        cells.append(f'<td style="vertical-align:top;text-align:left"><b>rank {rank["rank"]}</b> '
                     f'<span style="color:{_STATUS_COLOURS.get(rank["status"], "#888")}">{e(rank["status"])}</span>'
                     f'{progress}<pre style="max-height:20em;overflow:auto">{chr(10).join(rows)}</pre></td>')
    parts.append(f'<table><tr>{"".join(cells)}</tr></table>')
    for card in state["shape_mismatches"]:
        rows = "".join(f"<tr><td>{p['rank']}</td><td>{e(str(p['operation']))}</td><td>{e(str(p['shape']))}</td>"
                       f"<td>{e(str(p['dtype']))}</td><td>{e(str(p['call_site']))}</td></tr>" for p in card["processes"])
        parts.append(f'<div><b>shape mismatch in {e(card["operation"])}</b><table><tr><th>process</th>'
                     f'<th>operation</th><th>shape</th><th>dtype</th><th>call site</th></tr>{rows}</table></div>')
    if state["oom_retries"]:
        rows = "".join(f"<tr><td>{r['batch_size']} &rarr; {r['new_batch_size']}</td>"
                       f"<td>{e(', '.join(map(str, r['ranks'])))}</td><td>{e(r['error'])}</td></tr>"
                       for r in state["oom_retries"])
        parts.append(f"<div><b>out-of-memory retries</b><table><tr><th>batch size</th><th>ranks</th>"
                     f"<th>error</th></tr>{rows}</table></div>")
    for trigger in state["triggers"]:
        parts.append(f"<div>rank {trigger['rank']} called set_trigger() at {e(str(trigger['call_site']))}</div>")
    if failure and failure.get("message") and failure.get("traceback"):
        parts.append(f'<details><summary>full explanation</summary><pre>{e(failure["message"])}</pre></details>')
    parts.append("</div>")
    return "".join(parts)
