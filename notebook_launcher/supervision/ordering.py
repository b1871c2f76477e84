"""Kernel side: put ``in_order=True`` log records in rank order before they are shown.

Workers never wait for each other: each rank numbers its own in_order calls (1, 2, 3, ...) and the kernel holds
the records of call *n* until every rank has either sent its record of call *n*, said that its level filtered
it out, moved past it, or exited. A running rank that stops making in_order progress (stuck, or its code took
another path) holds the others back for at most ``stall_bound_s``; a rank still starting up is waited for.
While a rank has held records, its later events are held behind them, so each rank's own order is kept too. A
run of lines (``lines.StreamLines``, ``LogRecords``: none in_order) goes on, or is held, whole.
"""

from __future__ import annotations

import time
from collections import deque

from ..schema.events import EXIT, LOG, STATUS, STREAM, Event
from ..schema.lines import LogRecords

STALL_BOUND_S = 2.0


def in_order_id(event: Event) -> int | None:
    return event.data.get("in_order") if event.kind == LOG and type(event) is not LogRecords else None


class InOrderRelease:
    def __init__(self, ranks, show, stall_bound_s: float = STALL_BOUND_S):
        self._ranks = sorted(ranks)
        self._show = show
        self._bound = stall_bound_s
        self._queues: dict[int, deque] = {rank: deque() for rank in self._ranks}
        self._progress: dict[int, int] = {rank: 0 for rank in self._ranks}  # highest in_order id reported
        self._progress_at: dict[int, float] = {}  # set when the rank starts running its function
        self._gone: set[int] = set()
        self._first_seen: dict[int, float] = {}  # in_order id -> when its first record arrived
        self._held = 0  # events in the queues

    def push(self, event: Event) -> None:
        if not self._held and (event.kind == STREAM or event.kind == LOG and in_order_id(event) is None):
            self._show(event)  # nothing held anywhere: a line goes straight on (every run of a flood)
            return
        order = in_order_id(event)
        if order is not None:
            self._progress[event.rank] = max(self._progress.get(event.rank, 0), order)
            self._progress_at[event.rank] = time.monotonic()
            self._first_seen.setdefault(order, self._progress_at[event.rank])
            if event.data.get("skipped"):
                self.release()
                return
        if event.kind == STATUS and event.data.get("state") == "running":
            self._progress_at.setdefault(event.rank, time.monotonic())
        if event.kind == EXIT:
            self._gone.add(event.rank)
        queue = self._queues.setdefault(event.rank, deque())
        if queue or order is not None:
            queue.append(event)
            self._held += 1
        else:
            self._show(event)
        self.release()

    def release(self, everything: bool = False) -> None:
        """Show every group whose ranks have all answered (or stalled past the bound); ``everything`` at the end."""
        while True:
            heads = {rank: in_order_id(queue[0]) for rank, queue in self._queues.items() if queue}
            if not heads:
                return
            group = min(heads.values())
            if not everything and not self._group_ready(group):
                return
            for rank in sorted(heads):
                if heads[rank] == group:
                    queue = self._queues[rank]
                    self._held -= 1
                    self._show(queue.popleft())
                    while queue and in_order_id(queue[0]) is None:
                        self._held -= 1
                        self._show(queue.popleft())

    def _group_ready(self, group: int) -> bool:
        """Every rank answered call ``group``, or a missing one has been silent for the bound since both its
        own last in_order call and the group's first record."""
        now = time.monotonic()
        for rank in self._ranks:
            if rank in self._gone or self._progress[rank] >= group:
                continue
            if rank not in self._progress_at:  # still starting (imports, process group): it will come
                return False
            if now - max(self._progress_at[rank], self._first_seen.get(group, now)) < self._bound:
                return False
        self._first_seen.pop(group, None)
        return True
