"""A recorded run log played back through a display at its recorded pace: the panel at more ranks than this
machine can start (``copies`` repeats the ranks as further hosts), for demos, benchmarks and tests of the panel.

``replay(run_dir, copies=4)`` reads the run's events.jsonl and shows it as the launch showed it (in a notebook, the
live panel with its comm; elsewhere text): copy ``k`` of rank ``r`` is rank ``r + k * ranks``, on host
``node-k``. Nothing is started; the run log is only read.
"""

from __future__ import annotations

import os
import time

from ..schema.events import FAILURE, STATUS, Event
from ..schema.runlog import RunFileLines, parse_record
from ..schema.status import StopReason
from .logreader import read_summary
from .panel import PanelDisplay, wants_panel
from .state import RunState
from .text import TextDisplay

TICK_S = 0.05


def read_events(run_dir: str) -> list[Event]:
    """The run log's events, read with its bounds (``schema.runlog.RunFileLines``); a line that is not a
    record (cut short when the run was killed) is left out: the rest still plays."""
    events = []
    for line in RunFileLines(run_dir).read():
        record = parse_record(line)
        if record is not None:
            events.append(Event(rank=record["rank"], seq=record.get("seq", 0), time=record["time"] or 0.0,
                                kind=record["kind"], data=record["data"]))
    return events


def widen(events: list[Event], ranks: int, copies: int) -> list[Event]:
    """The events of ``copies`` hosts that each ran these ``ranks`` ranks alike, in time order."""
    out = []
    for copy in range(copies):
        for event in events:
            data = event.data
            if copies > 1 and event.kind == STATUS and data.get("state") == "starting":
                data = {**data, "host": f"node-{copy}"}
            out.append(Event(rank=event.rank + copy * ranks if event.rank >= 0 else event.rank, seq=event.seq,
                             time=event.time + copy * 1e-6, kind=event.kind, data=data))
    out.sort(key=lambda event: event.time)
    return out


def replay(run_dir: str, copies: int = 1, speed: float = 1.0, display: str = "auto"):
    """Play the run in ``run_dir`` back (``speed`` times as fast); returns the display it used."""
    summary = read_summary(run_dir)
    events = read_events(run_dir)
    ranks = int(summary.get("num_processes") or 1 + max((event.rank for event in events), default=0))
    events = widen(events, ranks, copies)
    world = ranks * copies
    if wants_panel(display):
        state = RunState(f"{os.path.basename(run_dir.rstrip(os.sep))}-replay-{copies}x", run_dir,
                         summary.get("device", "cpu"), summary.get("backend", "gloo"),
                         summary.get("start_method", "fork"), world, world, list(range(world)))
        shown = PanelDisplay(state)
    else:
        shown = TextDisplay("[rank ${rank}] ", 0, world)
    shown.note(f"replay of {run_dir} ({copies} x {ranks} ranks)")
    start, first = time.monotonic(), events[0].time if events else 0.0
    failure = None
    for event in events:
        due = start + (event.time - first) / speed
        while (wait := due - time.monotonic()) > 0:
            time.sleep(min(wait, TICK_S))
            shown.tick()
        shown.show(Event(rank=event.rank, seq=event.seq, time=due, kind=event.kind, data=event.data))
        if event.kind == FAILURE and failure is None:
            failure = {"kind": StopReason.FAILURE.value, "rank": event.rank, "type": event.data.get("type"),
                       "traceback": event.data.get("traceback", ""), "message": event.data.get("message", ""),
                       "stacks": {}}
    if isinstance(shown, PanelDisplay):
        shown.finish(summary.get("status", "finished"), failure=failure)
    return shown
