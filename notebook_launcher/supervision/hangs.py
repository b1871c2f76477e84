"""Where every rank is, without its cooperation, and when waiting there has become a hang.

Each rank's wrapped collectives keep a small record in shared memory up to date (``progress_record``: the
collective it is inside, since when, its call site); the kernel reads them at any time, even while a rank is
blocked inside a C++ collective and can say nothing on its pipes. ``HangWatch.is_hang`` is the automatic stop (a
rank waits for one that finished); ``StallWatch`` is the watchdog that only warns (no progress for a while).
"""

from __future__ import annotations

import os
import time

from ..schema.events import PROGRESS, STATUS, STREAM
from ..schema.lines import expand_lines
from ..schema.progress_record import ProgressRecord
from .failure import ranks_text
from .stacks import cell_names, innermost_user_frame, short_place, torch_place, user_stack

HANG_GRACE_S = 2.0  # how long ranks may wait in a collective after another rank has finished


class HangWatch:
    """The progress records of one attempt's ranks, in ``directory`` (none when it is empty)."""

    def __init__(self, directory: str):
        self.directory = directory
        self._records: dict[int, ProgressRecord] = {}
        self._first_seen: dict[int, tuple[int, float]] = {}  # rank -> (sequence, when first seen inside)
        self._done_at: dict[int, float] = {}  # rank -> when is_hang first saw it finished or exited

    def path_for(self, rank: int) -> str:
        """The file of ``rank``'s record (created now, in memory: ``progress_record.reserve``), or "" when records
        are not kept or memory cannot hold one (the rank runs without: the watch is blind to it)."""
        if not self.directory:
            return ""
        try:
            record = self._records[rank] = ProgressRecord(os.path.join(self.directory, f"progress-{rank}.bin"),
                                                          create=True)
        except OSError:
            return ""
        return record.path

    def read(self) -> dict[int, dict]:
        """rank -> its record; where the rank does not write when it entered (DDP's gradient all_reduce, entered
        at every step), ``since`` is when this watch first saw it there."""
        now, records = time.monotonic(), {}
        for rank, record in self._records.items():
            entry = records[rank] = record.read()
            if entry["inside"] and not entry["since"]:
                seen = self._first_seen.get(rank)
                if seen is None or seen[0] != entry["sequence"]:
                    seen = self._first_seen[rank] = (entry["sequence"], now)
                entry["since"] = seen[1]
        return records

    def is_hang(self, done: set[int], now: float) -> bool:
        """A rank has waited in a collective for HANG_GRACE_S since a rank in ``done`` (finished or exited) was
        first seen done: that rank will never join it. (Counted from then, not from the collective's start: a
        rank that waited long for one that completed the collective and then finished needs a moment to see
        it complete. Any other stall is the timeout's to catch.)"""
        if not self._records or not done:
            return False
        for rank in done:
            self._done_at.setdefault(rank, now)
        first_done = min(self._done_at[rank] for rank in done)
        waits = [now - max(record["since"], first_done) for rank, record in self.read().items()
                 if rank not in done and record["inside"]]
        return bool(waits) and max(waits) >= HANG_GRACE_S

    def snapshot(self, states: dict[int, str], now: float) -> dict[int, dict]:
        """rank -> its record (collective, sequence, call site, since), ``now`` and its ``state`` as given."""
        records = self.read()
        return {rank: {**records.get(rank, {}), "now": now, "state": state} for rank, state in states.items()}

    def close(self) -> None:
        for record in self._records.values():
            record.close()


class StallWatch:
    """The stall watchdog: a notice when no rank has made progress for ``warning_s`` seconds while at least one
    rank waits in a collective, and another when progress resumes. The run goes on either way.

    *Progress* is any of: a rank's progress record shows it completed a collective (its ``sequence`` grew, its
    ``inside`` went False, or its ``progressed_at`` moved: Python-level collectives and DDP's own), or a rank sent
    a ``progress`` event (``report(step=...)``); a rank starting its function (its "running" status) counts too,
    so that the time the ranks took to start is never taken for a stall. One notice per stall: after one opens,
    the next comes only after a "cleared" one. ``warning_s`` None: no watchdog.
    """

    def __init__(self, warning_s: float | None, hangs: HangWatch, timeout: float | None = None):
        self.warning_s = warning_s
        self._hangs = hangs
        self._timeout = timeout
        self._last_progress = time.monotonic()
        self._marks: dict[int, tuple] = {}  # rank -> (sequence, inside, progressed_at) when last read
        self._open_since: float | None = None  # a notice is open: the last progress before it
        self._capture: dict[int, list[str]] | None = None  # rank -> its stderr lines while stacks are collected

    def observe(self, event) -> None:
        """Every event of the attempt: ``progress`` reports, and stderr lines while stacks are being dumped."""
        if event.kind == PROGRESS or (event.kind == STATUS and event.data.get("state") == "running"):
            self._last_progress = max(self._last_progress, time.monotonic())
        elif self._capture is not None and event.kind == STREAM and event.data.get("stream") == "stderr":
            self._capture.setdefault(event.rank, []).append(str(event.data.get("text", "")))

    def observe_lines(self, lines: list) -> None:
        """``observe`` for plain lines passed on together: only stderr lines, while stacks are collected."""
        if self._capture is not None:
            for event in expand_lines(lines):
                self.observe(event)

    def _read_progress(self, now: float) -> dict[int, dict]:
        records = self._hangs.read()
        for rank, record in records.items():
            mark = (record.get("sequence", 0), record.get("inside", False), record.get("progressed_at", 0.0) or 0.0)
            sequence, inside, progressed_at = self._marks.get(rank, (0, False, 0.0))
            self._marks[rank] = mark
            if progressed_at < mark[2] <= now:
                self._last_progress = max(self._last_progress, mark[2])
            elif mark[0] > sequence or (inside and not mark[1]):
                self._last_progress = max(self._last_progress, now)
        return records

    def check(self, states: dict[int, str], now: float, dump) -> dict | None:
        """The data of a ``hang_notice`` event due now, or None. ``states``: rank -> "running" | "finished" |
        "exited"; ``dump()``: asks every live rank for its Python stacks and reads them (blocking briefly)."""
        if self.warning_s is None:
            return None
        records = self._read_progress(now)
        if self._open_since is not None:
            if self._last_progress <= self._open_since:
                return None
            lasted = self._last_progress - self._open_since
            self._open_since = None
            return {"state": "cleared", "quiet_s": round(lasted, 1), "text": f"progress resumed after {lasted:.0f} s"}
        quiet = now - self._last_progress
        if quiet < self.warning_s or not any(
                state == "running" and records.get(rank, {}).get("inside") for rank, state in states.items()):
            return None
        self._open_since = self._last_progress
        self._capture = {}
        try:
            dump()
            lines = self._capture
        finally:
            self._capture = None
        return notice(records, states, lines, quiet, now, self._timeout)  # times as seen when it was due


def notice(records: dict[int, dict], states: dict[int, str], dumps: dict[int, list[str]], quiet: float,
           now: float, timeout: float | None) -> dict:
    """The data of an open ``hang_notice``: each rank's place, the rank that diverged, the user's stacks, and
    the block of text the text display prints."""
    ranks, stacks, inside_torch = {}, {}, {}
    for rank in sorted(states):
        record, lines = records.get(rank, {}), dumps.get(rank, [])
        if states[rank] == "running" and not record.get("inside"):
            inside_torch[rank] = torch_place(lines)
        ranks[str(rank)] = _rank_place(record, states[rank], lines, now, inside_torch.get(rank, ""))
        stack = cell_names(user_stack(lines)) if states[rank] == "running" else ""
        if stack:
            stacks[str(rank)] = stack
    diverged, why = _diverged(records, states, inside_torch)
    text = [f"possible hang: no rank has made progress for {quiet:.0f} s"]
    text += [f"  rank {rank}: {place['text']}" for rank, place in ranks.items()]
    if why:
        text.append(why)
    for rank, stack in stacks.items():
        text += [f"Python stacks of rank {rank}:"] + [f"  {line}" for line in stack.splitlines()]
    text.append(f"The run goes on until timeout={timeout:g} s stops it; stop it sooner with the stop button "
                f"(interrupt)." if timeout is not None else "The run goes on; stop it with the stop button "
                "(interrupt), or pass timeout= to end such a run by itself.")
    return {"state": "open", "quiet_s": round(quiet, 1), "ranks": ranks, "diverged": diverged, "stacks": stacks,
            "text": "\n".join(text)}


def _rank_place(record: dict, state: str, lines: list[str], now: float, in_torch: str = "") -> dict:
    """{"state", "text"}: where one rank is, as one line of the notice. ``in_torch``: where its stack shows it
    in torch's own distributed code (``stacks.torch_place``), when its record shows no collective."""
    if state in ("finished", "exited"):
        return {"state": state, "text": state}
    operation, site = record.get("operation", ""), cell_names(record.get("call_site", "") or "?")
    if record.get("inside") and operation.startswith("DDP "):
        step = f" (step {record['step']})" if record.get("step") else ""
        return {"state": "in_ddp", "text": f"in DDP's {operation[4:]}{step} at {site}"}
    if record.get("inside"):
        waited = now - record.get("since", now)
        text = f"waiting {waited:.0f} s in {operation} #{record.get('sequence')} at {site}"
        return {"state": "waiting", "text": text}
    where = innermost_user_frame(lines)
    if in_torch:
        return {"state": "in_ddp" if in_torch.startswith("DDP") else "waiting",
                "text": f"in {in_torch} at {cell_names(where) or '?'}"}
    return {"state": "busy", "text": f"busy in its own code at {cell_names(where)}" if where else
            "busy in its own code (its Python stack did not come back)"}


def _diverged(records: dict[int, dict], states: dict[int, str], inside_torch: dict[int, str]) -> tuple[int | None, str]:
    """The one rank apart from the others (not in the collective every other rank waits in), and a line
    saying so; or, when ranks wait in different collectives (torch's own included), a line naming each."""
    groups: dict[tuple, list[int]] = {}
    for rank, state in states.items():
        record = records.get(rank, {})
        if state == "running" and record.get("inside"):
            groups.setdefault((record.get("operation"), record.get("sequence")), []).append(rank)
        elif state == "running" and inside_torch.get(rank):
            groups.setdefault((short_place(inside_torch[rank]), None), []).append(rank)
    if len(groups) > 1:
        places = sorted((ranks, operation if sequence is None else f"{operation} #{sequence}")
                        for (operation, sequence), ranks in groups.items())
        apart = [ranks for ranks, _ in places if len(ranks) == 1]
        everyone_waits = sum(len(ranks) for ranks, _ in places) == len(states)
        rank = apart[0][0] if len(apart) == 1 and len(places) == 2 and everyone_waits and len(states) > 2 else None
        said = ", ".join(f"{ranks_text(ranks)} in {where}" for ranks, where in places)
        return rank, f"ranks wait in different collectives: {said}."
    if len(groups) != 1:
        return None, ""
    (operation, sequence), waiting = next(iter(groups.items()))
    others = [rank for rank in states if rank not in waiting]
    if len(others) != 1:
        return None, ""
    rank = others[0]
    what = f"it has {states[rank]}" if states[rank] != "running" else "it is in its own code"
    place = operation if sequence is None else f"{operation} #{sequence}"
    return rank, f"rank {rank} diverged: the other ranks wait in {place}; {what}."
