"""The run panel for frontends without the JupyterLab extension (Colab, Kaggle, VS Code, GitHub, nbviewer,
``nbconvert``): ``text/plain`` and a static ``text/html``.

Both are made from the same state payload as the panel (``RunState.to_json()``) and read top down as the panel
does: the verdict (``summary.py``) as a card titled with it (a failure's traceback, a hang's places and stacks, the
out-of-memory steps in amber: each told once), a row per rank, the balance line, where the whole log is
(``inspect_run("<id>")``), then each rank's lines. Every ``<pre>`` names a monospace font and every table is left
aligned, inline: nbconvert's lab template sets ``pre {font-family: inherit}`` and GitHub keeps no stylesheet.
Each line of ``text/plain`` is also a line of the HTML's text, so an export that picks either misses nothing.
Everything that came from user code is escaped: the HTML is safe in untrusted notebooks.
"""

from __future__ import annotations

import html
import string

from ..schema.events import LOG, SHAPE_MISMATCH, TRIGGER
from ..schema.kinds import KINDS
from ..schema.status import RunStatus, StopReason
from .describe import describe, launcher_line, log_line
from .summary import rank_row, run_summary, seconds

MONO = "font-family:Menlo,Consolas,'DejaVu Sans Mono',monospace"
PRE = f'style="{MONO};font-size:12px;white-space:pre-wrap;margin:2px 0"'
OPEN_RANKS = 4  # up to this many ranks, every rank's lines are open; above it, those of ranks that failed or warned
_RED, _ORANGE, _AMBER, _GREEN, _BLUE, _GREY = "#d93025", "#e37400", "#b06000", "#188038", "#1a73e8", "#666"
_STATUS_COLOURS = {"starting": _GREY, "running": _BLUE, "finished": _GREEN, "failed": _RED, "stuck": _ORANGE,
                   "hung": _ORANGE, "timed out": _ORANGE, "interrupted": _GREY, "stopped": _GREY,
                   "waiting": _ORANGE, "busy": _ORANGE, "in DDP": _ORANGE}
_VERDICT_COLOURS = {"failed": _RED, "hang": _ORANGE, "hung": _ORANGE, "timed out": _ORANGE, "oom": _AMBER,
                    "finished": _GREEN, "running": _BLUE, "starting": _GREY, "interrupted": _GREY}
_LEVEL_COLOURS = {"DEBUG": "#888", "WARNING": _AMBER, "ERROR": _RED, "CRITICAL": _RED}
_COLUMNS = ("rank", "status", "step", "s/step", "ETA", "warnings", "errors", "last line")


def headline(state: dict) -> str:
    world = state["world_size"]
    return (f"notebook_launcher run {state['run_id']}: {state['status']}, {world} rank{'s' if world != 1 else ''} "
            f"on {state['device']} ({state['backend']}, {state['start_method']}), {seconds(state['elapsed'])}"
            + (f", attempt {state['attempt']}" if state.get("attempt", 1) > 1 else "")
            + (f", batch size {state['batch_size']}" if state.get("batch_size") is not None else ""))


def _summary(state: dict) -> dict:
    return state.get("summary") or run_summary(state)


def _rows(state: dict) -> list[tuple[int, str, dict]]:
    """(rank, status, row) per rank."""
    return [(rank["rank"], str(rank.get("status") or ""), rank["summary"] if "summary" in rank else rank_row(rank))
            for rank in state["ranks"]]


def rank_table(state: dict) -> list[str]:
    """The row per rank, as fixed-width text (the same lines in text/plain and, monospace, in the HTML)."""
    cells = [list(_COLUMNS)] + [[str(number), status, row.get("step", ""), row.get("speed", "").replace(" s/step", ""),
                                 row.get("eta", ""), str(row.get("warnings", 0)), str(row.get("errors", 0)),
                                 row.get("last", "")] for number, status, row in _rows(state)]
    widths = [max(len(row[column]) for row in cells) for column in range(len(_COLUMNS) - 1)]
    return ["  ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[-1]]).rstrip()
            for row in cells]


def _line_text(line: dict) -> str:
    if line["kind"] == LOG:
        return log_line(line.get("level"), line.get("logger"), line["text"])
    return line["text"]


def _line_colour(line: dict) -> str | None:
    if line["kind"] in ("retry", "attempt") or (line["kind"] == "stderr" and "OutOfMemoryRetry" in line["text"]):
        return _AMBER  # a step down of find_executable_batch_size, and the attempt after it: a retry, not a failure
    return _LEVEL_COLOURS.get(line.get("level")) or (_RED if line["kind"] == "stderr" else None)


def rank_lines(state: dict, rank: dict, prefix_template: str) -> list[tuple[int, str, str | None]]:
    """(n, text, colour) of a rank's kept lines, each prefixed as the text display prefixes them."""
    prefix = string.Template(prefix_template).safe_substitute(rank=rank["rank"], local_rank=rank["rank"],
                                                              role_name="default", node_rank=0)
    return [(line["n"], f"{prefix}{text}", _line_colour(line))
            for line in rank["lines"] for text in _line_text(line).split("\n")]


def earlier_note(state: dict) -> str | None:
    """Once for the run: how many lines only the run log has, and how to open it."""
    dropped = [(rank["rank"], rank["lines_dropped"]) for rank in state["ranks"] if rank.get("lines_dropped")]
    if not dropped:
        return None
    said = ", ".join(f"{count} of rank {number}" for number, count in dropped)
    return f"({said} earlier lines are in the run log: {_summary(state)['inspect']} shows them)"


def early_lines(state: dict) -> list[tuple[str, str | None]]:
    """The run's first warnings and errors that the ranks' lines no longer hold, under a title."""
    kept = {line["n"] for rank in state["ranks"] for line in rank["lines"]}
    early = [line for line in _summary(state).get("early") or [] if line["n"] not in kept]
    if not early:
        return []
    return [("first warnings and errors (older than the lines below):", _GREY)] + [
        (f"[rank {line['rank']}] {line['level']} {line['text']}", _LEVEL_COLOURS.get(line["level"])) for line in early]


def card_lines(state: dict) -> list[tuple[str, str | None]]:
    """The verdict and what explains it, told once: the title, its detail, a failure's traceback, the
    out-of-memory steps, earlier hangs."""
    summary = _summary(state)
    colour = _VERDICT_COLOURS.get(summary["verdict"], _GREY)
    out: list[tuple[str, str | None]] = [(summary["title"], colour), (headline(state), None)]
    out += [(f"  {line}", _AMBER if line.startswith("out of memory") else colour) for line in summary["detail"]]
    failure = state.get("failure") or {}
    if summary["verdict"] == "failed" and failure.get("traceback"):
        out += [(line, _RED) for line in failure["traceback"].rstrip("\n").splitlines()]
    return out + [(text, _GREY) for text in _earlier_hangs(state)]


def _earlier_hangs(state: dict) -> list[str]:
    """A hang that cleared (or one before the live one), one line each."""
    notices = [*(state.get("hangs") or []), *([state["hang"]] if state.get("hang") else [])]
    out = []
    for notice in notices:
        if notice.get("live"):
            continue
        how = (f"cleared after {notice['cleared_after']:.0f} s" if notice.get("cleared_after") is not None
               else "cleared" if notice.get("cleared_t") is not None else "not cleared before the run ended")
        quiet = f", {notice['quiet_s']:.0f} s without progress" if notice.get("quiet_s") is not None else ""
        out.append(f"possible hang at {notice.get('t', 0):.1f} s{quiet}: {how}")
    return out


def _shape_mismatch_lines(card: dict) -> list[tuple[str, str | None]]:
    return [(f"shape mismatch in {card['operation']}:", _RED)] + [
        (f"  - Process {p['rank']}: {p['shape']} {p['dtype'] or ''} at {p['call_site']}".rstrip(), None)
        for p in card["processes"]]


def _trigger_lines(card: dict) -> list[tuple[str, str | None]]:
    return [(f"rank {card['rank']} called {describe(TRIGGER, card).text}", None)]


# the lines of each card of the kinds the fallback shows as cards (``Kind.fallback == "cards"``), in KINDS' order
CARD_LINES = {SHAPE_MISMATCH: _shape_mismatch_lines, TRIGGER: _trigger_lines}
_CARDS = tuple((kind.cards, CARD_LINES[kind.name]) for kind in KINDS if kind.cards and kind.name in CARD_LINES)


def _other_cards(state: dict) -> list[tuple[str, str | None]]:
    return [line for key, lines in _CARDS for card in state[key] for line in lines(card)]


def text_lines(state: dict, prefix_template: str = "[rank ${rank}] ") -> list[tuple[str, str | None]]:
    """The text fallback's lines, each with a colour hint: the verdict card, the row per rank, the balance, where
    the whole log is, the launcher's notes, then every rank's lines in arrival order and the other cards."""
    summary = _summary(state)
    out = card_lines(state)
    out += [(line, None) for line in rank_table(state)]
    if summary.get("balance"):
        out.append((summary["balance"], None))
    out.append((earlier_note(state) or f"whole log: {summary['inspect']}", _GREY))
    out += [(launcher_line(note), _GREY) for note in state["notes"]]
    out += early_lines(state)
    lines = [line for rank in state["ranks"] for line in rank_lines(state, rank, prefix_template)]
    out += [(text, colour) for _, text, colour in sorted(lines, key=lambda item: item[0])]
    return out + _other_cards(state)


def render_text(state: dict, prefix_template: str = "[rank ${rank}] ") -> str:
    """What a terminal and ``nbconvert --to markdown`` show."""
    return "\n".join(text for text, _ in text_lines(state, prefix_template))


def _pre(lines: list[tuple[str, str | None]]) -> str:
    e = html.escape
    body = "\n".join(f'<span style="color:{colour}">{e(text)}</span>' if colour else e(text) for text, colour in lines)
    return f"<pre {PRE}>{body}</pre>"


def _stacks(state: dict) -> dict:
    failure, hang = state.get("failure") or {}, state.get("hang") or {}
    if failure.get("kind") in (StopReason.HANG, StopReason.TIMEOUT) and failure.get("stacks"):
        return failure["stacks"]
    ended_stuck = state["status"] in (RunStatus.HUNG, RunStatus.TIMED_OUT)
    return hang.get("stacks") or {} if (hang.get("live") or ended_stuck) else {}


def render_html(state: dict, prefix_template: str = "[rank ${rank}] ") -> str:
    """A static page for Colab, Kaggle, VS Code, GitHub, nbviewer and ``nbconvert``: the verdict card first, the
    row per rank, then a ``<details>`` per rank with its lines (see the module's docstring)."""
    e = html.escape
    summary = _summary(state)
    colour = _VERDICT_COLOURS.get(summary["verdict"], _GREY)
    cards = card_lines(state)
    parts = ['<div class="nl-run-static" style="text-align:left">',
             f'<div class="nl-verdict" data-verdict="{e(summary["verdict"])}" style="border-left:4px solid {colour};'
             f'padding:4px 8px;margin:2px 0 6px 0;background:{colour}0f">',
             f'<div style="font-weight:bold;color:{colour}">{e(cards[0][0])}</div>',
             f'<div style="color:{_GREY}">{e(cards[1][0])}</div>']
    if cards[2:]:
        parts.append(_pre(cards[2:]))
    for rank, stack in sorted(_stacks(state).items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0):
        parts.append(f"<details><summary>rank {e(rank)}: Python stack</summary>{_pre([(stack, None)])}</details>")
    parts.append("</div>")
    table = rank_table(state)
    parts.append(_pre([(table[0], _GREY), *((line, _STATUS_COLOURS.get(status))
                                            for line, (_, status, _) in zip(table[1:], _rows(state)))]))
    balance = [(summary["balance"], None)] if summary.get("balance") else []
    parts.append(_pre([*balance, (earlier_note(state) or f"whole log: {summary['inspect']}", _GREY),
                       *((launcher_line(note), _GREY) for note in state["notes"]), *early_lines(state)]))
    many = len(state["ranks"]) > OPEN_RANKS
    for rank, (_, status, row) in zip(state["ranks"], _rows(state)):
        lines = rank_lines(state, rank, prefix_template)
        opened = not many or row.get("errors") or row.get("warnings") or status in ("failed", "stuck")
        parts.append(f'<details class="nl-rank-lines" data-rank="{rank["rank"]}"{" open" if opened else ""}>'
                     f'<summary>rank {rank["rank"]}: {e(status)}, {len(lines)} lines</summary>'
                     f'{_pre([(text, colour) for _, text, colour in lines])}</details>')
    others = _other_cards(state)
    if others:
        parts.append(_pre(others))
    parts.append("</div>")
    return "".join(parts)
