"""What changed in the panel's state since the last update: the message a listening panel gets instead of the
whole state again (the protocol is in labextension/SCHEMA.md, "Live updates"; ``apply_delta`` here and
``applyDelta`` in labextension/src/delta.ts are the same rule, and tests check that deltas rebuild the state).

A delta carries, with ``seq`` (this update's number) and ``base`` (the one it applies on):

- ``set``: each top-level field whose value changed (the header's ``elapsed`` always), whole;
- ``order``: the rank numbers, only when the set of ranks changed (a rank not listed goes);
- ``ranks``: per rank that changed, its changed fields, its new ``lines`` and new chart ``history`` points
  (each ``[step, t, step_time, metrics]``), appended and cut to the newest ``caps["lines"]`` /
  ``caps["history"]``. Lines are rows relative to the line before (``at``: ``[n, t in ms]`` of the first new
  line): ``[dn, dt in ms, text]`` for stdout, ``[dn, dt, text, kind]`` otherwise, ``[dn, dt, text, "log",
  level, logger]`` for a log record, oldest first (a line costs its text and about ten bytes). When new points
  come without ``progress``, the receiver makes the progress from them (``derived_progress``: what a report()
  does); ``progress`` comes when that would not give it. ``lines_total`` only when it is not the old count
  plus the new lines (more lines came than the state keeps); ``new`` when the receiver starts the rank afresh
  (a rank it has not seen, or one a rendezvous remade).

The receiver keeps ``lines_dropped`` = ``lines_total`` - its number of lines.
"""

from __future__ import annotations

import json

from .rank_state import HISTORY_POINTS
from .state import RunState

RANK_FIELDS = ("host", "status", "pid", "exit_code", "progress", "summary")


def compact_line_rows(lines: list[dict]) -> tuple[list, list]:
    """``at`` and the rows of ``lines`` (oldest first; see the module's docstring)."""
    rows, n_before, ms_before = [], lines[0]["n"], round(lines[0]["t"] * 1000)
    at = [n_before, ms_before]
    for line in lines:
        ms = round(line["t"] * 1000)
        row = [line["n"] - n_before, ms - ms_before, line["text"]]
        if "level" in line:
            row += [line["kind"], line["level"], line.get("logger")]
        elif line["kind"] != "stdout":
            row.append(line["kind"])
        rows.append(row)
        n_before, ms_before = line["n"], ms
    return at, rows


def expand_line_rows(at: list, rows: list) -> list[dict]:
    n, ms = at
    lines = []
    for row in rows:
        n, ms = n + row[0], ms + row[1]
        line = {"n": n, "t": ms / 1000, "kind": row[3] if len(row) > 3 else "stdout", "text": row[2]}
        if len(row) > 4:
            line["level"], line["logger"] = row[4], row[5]
        lines.append(line)
    return lines


def compact_point(point: dict) -> list:
    return [point["step"], point["t"], point["step_time"], point["metrics"]]


def expand_point(row: list) -> dict:
    return {"step": row[0], "t": row[1], "step_time": row[2], "metrics": row[3]}


def derived_progress(progress: dict | None, points: list[dict]) -> dict:
    """A rank's progress as its new chart points tell it (what a report() makes of them): the last point's step
    and step time, the total as before, every metric's latest value."""
    before = progress or {}
    metrics = dict(before.get("metrics") or {})
    for point in points:
        metrics.update(point["metrics"])
    return {"step": points[-1]["step"], "total": before.get("total"), "metrics": metrics,
            "step_time": points[-1]["step_time"]}


class DeltaTracker:
    """Remembers what the listeners were last sent, and makes the next delta from a ``RunState``."""

    def __init__(self, state: RunState):
        self.state = state
        self.seq = 0
        self.caps = {"lines": state.lines_per_rank, "history": HISTORY_POINTS}
        self._top: dict[str, str] = {}
        self._order: list[int] = []
        self._ranks: dict[int, dict] = {}

    def reset(self) -> dict:
        """A new baseline (the state as it is now, for a first listener); returns its payload."""
        payload = self.state.to_json()
        self.seq += 1
        self._top = {key: json.dumps(value) for key, value in payload.items() if key != "ranks"}
        self._order = [rank["rank"] for rank in payload["ranks"]]
        self._ranks = {}
        for number, rank in self.state.ranks.items():
            self._ranks[number] = self._remember(rank)
        return payload

    @staticmethod
    def _remember(rank) -> dict:
        return {"object": rank, "fields": {name: getattr(rank, name) for name in RANK_FIELDS},
                "n": rank.lines[-1]["n"] if rank.lines else 0, "total": rank.lines_total,
                "history": rank.history_count}

    def delta(self) -> dict:
        """The changes since the last delta (or reset), numbered ``seq``; an empty one still moves the clock."""
        payload = self.state.to_json()
        out: dict = {"type": "delta", "seq": self.seq + 1, "base": self.seq, "set": {}}
        for key, value in payload.items():
            if key == "ranks":
                continue
            encoded = json.dumps(value)
            if self._top.get(key) != encoded:
                out["set"][key] = value
                self._top[key] = encoded
        order = [rank["rank"] for rank in payload["ranks"]]
        if order != self._order:
            out["order"] = order
            self._order = order
        ranks = []
        for number in order:
            change = self._rank_delta(number)
            if change is not None:
                ranks.append(change)
        self._ranks = {number: memory for number, memory in self._ranks.items() if number in self.state.ranks}
        if ranks:
            out["ranks"] = ranks
        self.seq += 1
        return out

    def _rank_delta(self, number: int) -> dict | None:
        rank = self.state.ranks[number]
        before = self._ranks.get(number)
        change: dict = {}
        if before is None or before["object"] is not rank:  # a rank new to the receiver, or one set_ranks remade
            before = {"fields": {}, "n": 0, "total": 0, "history": 0}
            change["new"] = True
        new_points = min(rank.history_count - before["history"], len(rank.history))
        points = list(rank.history)[-new_points:] if new_points > 0 else []
        for name in RANK_FIELDS:
            value = getattr(rank, name)
            if name not in before["fields"] or before["fields"][name] != value:
                change[name] = value
        if points and "new" not in change and \
                derived_progress(before["fields"].get("progress"), points) == rank.progress:
            change.pop("progress", None)  # the usual case: the receiver makes it from the points (half the bytes)
        elif points and "progress" not in change:
            change["progress"] = rank.progress  # (what the points would make of it is not the progress)
        fresh = []
        for line in reversed(rank.lines):
            if line["n"] <= before["n"]:
                break
            fresh.append(line)
        if fresh:
            change["at"], change["lines"] = compact_line_rows(fresh[::-1])
        if rank.lines_total != before["total"] + len(fresh) or "new" in change:
            change["lines_total"] = rank.lines_total
        if points:
            change["history"] = [compact_point(point) for point in points]
        self._ranks[number] = self._remember(rank)
        if not change:
            return None
        return {"rank": number, **change}


def apply_delta(state: dict, delta: dict, caps: dict) -> dict:
    """The receiver's rule (labextension/src/delta.ts does the same): a new state, ``state`` left as it was."""
    out = {**state, **delta.get("set", {}), "seq": delta["seq"]}
    out.pop("saved", None)  # a cut snapshot no longer: the live lines come in whole
    ranks = {rank["rank"]: rank for rank in state.get("ranks") or []}
    order = delta.get("order") or [rank["rank"] for rank in state.get("ranks") or []]
    blank = {change["rank"] for change in delta.get("ranks") or [] if change.get("new")}
    for number in order:
        if number not in ranks or number in blank:
            ranks[number] = {"rank": number, "host": None, "status": "starting", "pid": None, "exit_code": None,
                             "lines": [], "lines_total": 0, "lines_dropped": 0, "progress": None, "history": []}
    for change in delta.get("ranks") or []:
        rank = dict(ranks[change["rank"]])
        lines = expand_line_rows(change["at"], change["lines"]) if change.get("lines") else []
        points = [expand_point(row) for row in change.get("history") or []]
        for name, value in change.items():
            if name not in ("rank", "at", "lines", "history", "new"):
                rank[name] = value
        if points and "progress" not in change:
            rank["progress"] = derived_progress(rank.get("progress"), points)
        if "lines_total" not in change:
            rank["lines_total"] = rank.get("lines_total", 0) + len(lines)
        if lines:
            rank["lines"] = [*rank.get("lines", []), *lines][-caps["lines"]:]
        if points:
            rank["history"] = [*rank.get("history", []), *points][-caps["history"]:]
        rank["lines_dropped"] = rank["lines_total"] - len(rank.get("lines", []))
        ranks[change["rank"]] = rank
    out["ranks"] = [ranks[number] for number in order]
    return out
