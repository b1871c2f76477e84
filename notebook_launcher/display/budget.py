"""The saved output's budget: the panel's MIME bundle cut to at most ``SAVED_BYTES`` whatever the number of ranks.

What the notebook keeps is the last bundle the kernel published: the state payload and its ``text/html`` and
``text/plain`` fallbacks, each of which carries the lines. Without a bound, 64 ranks x 200 lines make a cell of
several megabytes. The budget is shared in this order (sizes as nbformat writes them: indented JSON, strings
split into lines):

1. the summary and what explains the run, each capped: header and notes (newest first), the failure (traceback,
   message, stacks), the hang cards, the shape-mismatch / out-of-memory / trigger cards (newest first);
2. each rank's status and progress, and its newest chart points (at most ``HISTORY_SHARE`` of the budget, the same
   number of points for every rank);
3. what is left goes to the newest lines of each rank, in equal shares; a rank that needs less than its share
   leaves the rest to the others. The cut is always the oldest lines, so what remains is in order. The
   ``text/html`` and ``text/plain`` fallbacks (frontends without the extension) carry the same lines, and the
   warnings and errors among the cut ones (at most ``NOTABLE_PER_RANK`` of each rank): a line costs its text
   three times.

The budget is 200 KB, well under 300 KB, because the output's last update is also what a listening browser
receives once more at the end, on top of the deltas.

The payload then says what was cut: ``saved`` = ``{"limit", "lines_total", "lines_kept"}`` (the run log on disk,
``run_dir``, has every line). The live panel is not cut: it gets every line through deltas (``delta.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ..schema.kinds import CARD_LISTS

SAVED_BYTES = 200_000
NOTABLE_PER_RANK = 20  # warnings and errors of a rank that the fallbacks keep when its older lines are cut
NOTABLE = ("WARNING", "ERROR", "CRITICAL")
HISTORY_SHARE = 0.15
CARDS_SHARE = 0.15  # notes, the failure, hang notices and cards together
MAX_FAILURE_TEXT = 8_000  # the root cause's traceback and the message each (the run log has all of them)
MAX_ATTEMPTS = 5  # measure, shrink the lines' share, measure again

Render = Callable[[dict, dict], dict]  # (state payload, the fallbacks' payload) -> the bundle (payload, html, plain)


def saved_size(bundle: dict, metadata: dict | None = None) -> int:
    """Bytes of this bundle (and the output's ``metadata``, where given) in an .ipynb as nbformat writes it
    (indent 1, nested in a cell's output, strings as lists of lines): the compact JSON (C encoder) plus the
    indentation, counted by a walk (``indent=`` would make json use its pure-Python encoder, ten times slower).
    Every MIME type counts, a widget's view too."""
    data = {mime: value.splitlines(True) if isinstance(value, str) else value for mime, value in bundle.items()}
    output = {"data": data} if metadata is None else {"data": data, "metadata": metadata}
    document = {"cells": [{"outputs": [output]}]}
    return len(json.dumps(document, ensure_ascii=False).encode("utf-8", "surrogatepass")) + _indentation(document, 0)


def _indentation(value, depth: int) -> int:
    """What ``indent=1`` adds to compact JSON: a newline and the depth's spaces before each item and the closing
    bracket, less the space after each "," (indent uses "," alone)."""
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return 0
    count = len(items)
    if not count:
        return 0
    extra = count * (depth + 2) + depth + 1 - (count - 1)
    for item in items:
        if isinstance(item, (dict, list)):
            extra += _indentation(item, depth + 1)
    return extra


def _rough_size(payload: dict) -> int:
    """A cheap lower bound of the saved bundle's size: each line's text is in all three renderings."""
    return sum(3 * len(line.get("text") or "")
               for rank in payload.get("ranks") or [] for line in rank.get("lines") or [])


def bounded_bundle(payload: dict, render: Render, limit: int = SAVED_BYTES) -> dict:
    """The bundle of ``payload`` within ``limit`` bytes (see the module's docstring for how it is shared)."""
    if _rough_size(payload) <= limit:
        bundle = render(payload, payload)
        if saved_size(bundle) <= limit:
            return bundle
    base = _bounded_parts(payload, limit)
    lines_total = sum(rank.get("lines_total", 0) for rank in payload["ranks"])
    lean = _with_lines(base, payload, [0] * len(payload["ranks"]), limit, lines_total)
    fixed = saved_size(render(lean, lean))
    room = limit - fixed
    if room <= 0:
        return render(lean, lean)
    share, best = room, render(lean, lean)
    for _ in range(MAX_ATTEMPTS):  # the shares are estimates: measure, correct in proportion, measure again
        counts = _share_lines(payload["ranks"], share)
        kept = _with_lines(base, payload, counts, limit, lines_total)
        candidate = render(kept, _fallback_lines(kept, payload))
        size = saved_size(candidate)
        fits = size <= limit
        if fits:
            best = candidate
            everything = all(count == len(rank.get("lines") or []) for count, rank in zip(counts, payload["ranks"]))
            if everything or size - fixed >= room * 0.85:
                break
        share = int(share * room / max(1, size - fixed) * 0.97)
    return best


def _fallback_lines(kept: dict, payload: dict) -> dict:
    """``kept`` with, for the fallbacks, the newest warnings and errors of each rank's cut lines before its kept
    ones (in order: they are older)."""
    ranks = []
    for rank, whole in zip(kept["ranks"], payload["ranks"]):
        lines = whole.get("lines") or []
        cut = lines[:len(lines) - len(rank["lines"])]
        notable = [line for line in cut if line.get("level") in NOTABLE][-NOTABLE_PER_RANK:]
        shown = notable + rank["lines"]
        ranks.append({**rank, "lines": shown, "lines_dropped": rank.get("lines_total", 0) - len(shown)})
    return {**kept, "ranks": ranks}


def _cost(line: dict) -> int:
    """A line's rough weight in the saved bundle (its JSON object, and its text in both fallbacks), for the
    shares."""
    return 3 * len(line.get("text") or "") + 110


def _share_lines(ranks: list[dict], room: int) -> list[int]:
    """How many newest lines each rank keeps: equal shares of ``room``, what a rank does not use passed on."""
    costs = [[_cost(line) for line in reversed(rank.get("lines") or [])] for rank in ranks]
    counts = [0] * len(ranks)
    active = [index for index, rank_costs in enumerate(costs) if rank_costs]
    while active and room > 0:
        share = room // len(active)
        if share <= 0:
            break
        spent, still = 0, []
        for index in active:
            used, budget = 0, share
            rank_costs = costs[index]
            while counts[index] < len(rank_costs) and used + rank_costs[counts[index]] <= budget:
                used += rank_costs[counts[index]]
                counts[index] += 1
            spent += used
            if counts[index] < len(rank_costs) and used + rank_costs[counts[index]] <= budget + share:
                still.append(index)  # hungry, and one more line could fit in a later round
        if spent == 0:
            break
        room -= spent
        active = still
    return counts


def _with_lines(base: dict, payload: dict, counts: list[int], limit: int, lines_total: int) -> dict:
    ranks = []
    for rank, kept_rank, count in zip(payload["ranks"], base["ranks"], counts):
        lines = (rank.get("lines") or [])[len(rank.get("lines") or []) - count:] if count else []
        ranks.append({**kept_rank, "lines": lines, "lines_dropped": rank.get("lines_total", 0) - len(lines)})
    kept = sum(len(rank["lines"]) for rank in ranks)
    return {**base, "ranks": ranks, "saved": {"limit": limit, "lines_total": lines_total, "lines_kept": kept}}


def _bounded_parts(payload: dict, limit: int) -> dict:
    """Everything but the lines, each part capped (see the module's docstring)."""
    cards = int(limit * CARDS_SHARE)
    out = dict(payload)
    out["notes"] = _newest(payload.get("notes") or [], cards // 4)
    failure = payload.get("failure")
    if failure:
        stacks = failure.get("stacks") or {}
        out["failure"] = {**failure, "traceback": _cut(failure.get("traceback"), MAX_FAILURE_TEXT),
                          "message": _cut(failure.get("message"), MAX_FAILURE_TEXT),
                          "stacks": dict(_newest(sorted(stacks.items(), key=lambda item: int(item[0])
                                                        if item[0].lstrip("-").isdigit() else 0),
                                                 cards // 4, oldest_first=True))}
    for key in CARD_LISTS:
        out[key] = _newest(payload.get(key) or [], cards // 8)
    hang = payload.get("hang")
    if hang and len(json.dumps(hang)) > cards // 4:
        out["hang"] = {**hang, "stacks": {}, "stacks_dropped": len(hang.get("stacks") or {})}
    points = 0
    ranks = payload.get("ranks") or []
    longest = max((len(rank.get("history") or []) for rank in ranks), default=0)
    if ranks and longest:
        sample = [point for rank in ranks for point in (rank.get("history") or [])[-1:]]
        per_point = max(60, max(len(json.dumps(point, indent=1)) + 8 * 6 for point in sample))
        points = min(longest, int(limit * HISTORY_SHARE / len(ranks) / per_point))
    out["ranks"] = [{**rank, "lines": [], "history": (rank.get("history") or [])[-points:] if points else []}
                    for rank in ranks]
    return out


def _cut(text, limit: int):
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return f"{text[:limit]}\n... ({len(text) - limit} more characters in the run log)"


def _newest(items: list, budget: int, oldest_first: bool = False) -> list:
    """The newest items (the list's end) whose JSON fits in ``budget`` bytes, in their order."""
    kept, used = [], 0
    for item in reversed(items) if not oldest_first else items:
        size = len(json.dumps(item, ensure_ascii=False)) + 16
        if used + size > budget:
            break
        kept.append(item)
        used += size
    return kept[::-1] if not oldest_first else kept
