"""Where every rank is, without its cooperation, and when waiting there has become a hang.

Each rank's wrapped collectives keep a small record in shared memory up to date (``progress_record``: the
collective each of its threads is inside or waits for, since when, its call site, its process group); the kernel
reads them at any time, even while a rank is blocked inside a C++ collective and can say nothing on its pipes.
A rank is judged by its oldest unfinished wait, whatever its other threads do, and only against the ranks of
that collective's process group. ``HangWatch.is_hang`` is the automatic stop (a rank waits for a member of the
group that finished); ``StallWatch`` is the watchdog that only warns (no progress for a while).
"""

from __future__ import annotations

import os
import time

from ..schema.cells import cell_names
from ..schema.events import PROGRESS, STATUS, STREAM
from ..schema.lines import StreamLines
from ..schema.progress_record import MEMBER_BITS, ProgressRecord, is_member, oldest_wait
from .failure import async_wait, ranks_text
from .stacks import innermost_user_frame, short_place, torch_place, user_stack

HANG_GRACE_S = 2.0  # how long ranks may wait in a collective after another rank has finished


class HangWatch:
    """The progress records of one attempt's ranks, in ``directory`` (none when it is empty)."""

    def __init__(self, directory: str):
        self.directory = directory
        self._records: dict[int, ProgressRecord] = {}
        self._first_seen: dict[tuple, tuple[int, float]] = {}  # (rank, slot) -> (sequence, when first seen inside)
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
        """rank -> where it is: its oldest unfinished wait (of any thread), else its main thread's last
        collective (``ProgressRecord.read``)."""
        return {rank: oldest_wait(places) or places[0] for rank, places in self.read_slots().items()}

    def read_slots(self) -> dict[int, list[dict]]:
        """rank -> each of its threads' places (``ProgressRecord.slots``); where the rank does not write when it
        entered (DDP's gradient all_reduce, entered at every step), ``since`` is when this watch first saw it
        there."""
        now, records = time.monotonic(), {}
        for rank, record in self._records.items():
            places = records[rank] = record.slots()
            for place in places:
                if place["inside"] and not place["since"]:
                    key = (rank, place["slot"])
                    seen = self._first_seen.get(key)
                    if seen is None or seen[0] != place["sequence"]:
                        seen = self._first_seen[key] = (place["sequence"], now)
                    place["since"] = seen[1]
        return records

    def is_hang(self, done: set[int], now: float) -> bool:
        """A rank (any of its threads) has waited in a collective for HANG_GRACE_S since a rank of that
        collective's process group in ``done`` (finished or exited) was first seen done: that rank will never
        join it. A done rank outside the group is no evidence. (Counted from then, not from the collective's
        start: a rank that waited long for one that completed the collective and then finished needs a moment
        to see it complete. Any other stall is the timeout's to catch.)"""
        if not self._records or not done:
            return False
        for rank in done:
            self._done_at.setdefault(rank, now)
        for rank, places in self.read_slots().items():
            for place in places if rank not in done else ():
                absent = [self._done_at[other] for other in done if is_member(place["members"], other)]
                if place["inside"] and absent and now - max(place["since"], min(absent)) >= HANG_GRACE_S:
                    return True
        return False

    def snapshot(self, states: dict[int, str], now: float) -> dict[int, dict]:
        """rank -> its record (collective, sequence, call site, since, ``group``: its process group's ranks,
        None for the default group), ``now`` and its ``state`` as given."""
        records = {rank: with_group(record) for rank, record in self.read().items()}
        return {rank: {**records.get(rank, {}), "now": now, "state": state} for rank, state in states.items()}

    def close(self) -> None:
        for record in self._records.values():
            record.close()


def with_group(record: dict) -> dict:
    """``record`` with its process group's ``members`` bitmap as ``group``: the sorted global ranks (of those
    the record can name), or None for the default group (every rank)."""
    record = dict(record)
    members = record.pop("members", b"")
    record["group"] = [rank for rank in range(MEMBER_BITS) if is_member(members, rank)] if members else None
    return record


class StallWatch:
    """The stall watchdog: a notice when a rank has waited in a collective for ``warning_s`` seconds while no
    other rank of that collective's process group has made progress, and another when progress resumes. The
    run goes on either way.

    A rank is judged by its oldest unfinished wait (any of its threads; an async collective's ``wait()``
    included). *Progress* of a rank is any of: its progress record shows one of its threads completed a
    collective (a ``sequence`` grew, an ``inside`` went False, or a ``progressed_at`` moved: Python-level
    collectives and DDP's own) on a group of more than this one rank, or it sent a ``progress`` event
    (``report(step=...)``); its starting its function (its "running" status) counts too, so that the time the
    ranks took to start is never taken for a stall. A rank's own progress never clears its own wait: its
    background thread's collectives do not hide its main thread's stall. One notice per stall: after one
    opens, the next comes only after a "cleared" one. ``warning_s`` None: no watchdog.
    """

    def __init__(self, warning_s: float | None, hangs: HangWatch, timeout: float | None = None):
        self.warning_s = warning_s
        self._hangs = hangs
        self._timeout = timeout
        self._started = time.monotonic()
        self._progress_at: dict[int, float] = {}  # rank -> when it last made progress
        self._marks: dict[tuple, tuple] = {}  # (rank, slot) -> (sequence, inside, progressed_at) when last read
        self._open: tuple | None = None  # a notice is open: the stalled wait's (rank, slot, sequence, members)
        self._open_since = 0.0  # ...and the last progress before it
        self._capture: dict[int, list[str]] | None = None  # rank -> its stderr lines while stacks are collected

    def observe(self, event) -> None:
        """Every event of the attempt (a run of lines whole): ``progress`` reports, and stderr lines while stacks
        are being dumped."""
        if event.kind == PROGRESS or (event.kind == STATUS and event.data.get("state") == "running"):
            self._progressed(event.rank, time.monotonic())
        elif self._capture is not None and event.kind == STREAM:
            if type(event) is StreamLines:
                if event.stream == "stderr":
                    self._capture.setdefault(event.rank, []).extend(event.texts)
            elif event.data.get("stream") == "stderr":
                self._capture.setdefault(event.rank, []).append(str(event.data.get("text", "")))

    def _progressed(self, rank: int, at: float) -> None:
        self._progress_at[rank] = max(self._progress_at.get(rank, self._started), at)

    def _read_progress(self, now: float) -> dict[int, list[dict]]:
        slots = self._hangs.read_slots()
        for rank, places in slots.items():
            for place in places:
                key = (rank, place["slot"])
                mark = (place["sequence"], place["inside"], place["progressed_at"] or 0.0)
                sequence, inside, progressed_at = self._marks.get(key, (0, False, 0.0))
                self._marks[key] = mark
                if _alone(place["members"], rank):
                    continue  # a collective of the rank with itself: its own work, like computing
                if progressed_at < mark[2] <= now:
                    self._progressed(rank, mark[2])
                elif mark[0] > sequence or (inside and not mark[1]):
                    self._progressed(rank, now)
        return slots

    def _last_progress(self, rank: int, wait: dict, states: dict[int, str]) -> float:
        """The latest of: when ``rank`` began ``wait``, when another rank of its group last made progress."""
        others = [self._progress_at.get(other, self._started) for other in states
                  if other != rank and is_member(wait["members"], other)]
        return max([wait["since"], *others])

    def check(self, states: dict[int, str], now: float, dump) -> dict | None:
        """The data of a ``hang_notice`` event due now, or None. ``states``: rank -> "running" | "finished" |
        "exited"; ``dump()``: asks every live rank for its Python stacks and reads them (blocking briefly)."""
        if self.warning_s is None:
            return None
        slots = self._read_progress(now)
        if self._open is not None:
            rank, slot, sequence, members = self._open
            place = next((place for place in slots.get(rank, ()) if place["slot"] == slot), None)
            if place is not None and place["inside"] and place["sequence"] == sequence:
                last = self._last_progress(rank, {"since": 0.0, "members": members}, states)
                if last <= self._open_since:
                    return None
            else:
                last = place["progressed_at"] if place and place["progressed_at"] > self._open_since else now
            lasted = last - self._open_since
            self._open = None
            return {"state": "cleared", "quiet_s": round(lasted, 1), "text": f"progress resumed after {lasted:.0f} s"}
        records, stalled = {}, []
        for rank, places in slots.items():
            wait = oldest_wait(places)
            records[rank] = wait or places[0]
            if wait is not None and states.get(rank) == "running":
                stalled.append((now - self._last_progress(rank, wait, states), rank, wait))
        if not stalled or max(stalled, key=lambda item: item[0])[0] < self.warning_s:
            return None
        quiet, rank, wait = max(stalled, key=lambda item: item[0])
        self._open = (rank, wait["slot"], wait["sequence"], wait["members"])
        self._open_since = now - quiet
        self._capture = {}
        try:
            dump()
            lines = self._capture
        finally:
            self._capture = None
        return notice(records, states, lines, quiet, now, self._timeout)  # times as seen when it was due


def _alone(members: bytes, rank: int) -> bool:
    """Whether a group's ``members`` bitmap names ``rank`` alone."""
    return bool(members) and int.from_bytes(members, "little").bit_count() == 2 and is_member(members, rank)


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
            "text": "\n".join(text), "verdict": why, "timeout": timeout}


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
        text = f"waiting {waited:.0f} s in {operation} #{record.get('sequence')}{async_wait(record)} at {site}"
        return {"state": "waiting", "text": text, "waited": round(waited, 1)}
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
    members = records.get(waiting[0], {}).get("members", b"")  # a rank outside the group is not its business
    others = [rank for rank in states if rank not in waiting and is_member(members, rank)]
    if len(others) != 1:
        return None, ""
    rank = others[0]
    what = f"it has {states[rank]}" if states[rank] != "running" else "it is in its own code"
    place = operation if sequence is None else f"{operation} #{sequence}"
    return rank, f"rank {rank} diverged: the other ranks wait in {place}; {what}."
