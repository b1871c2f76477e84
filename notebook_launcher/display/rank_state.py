"""One rank's column of the panel: its status, its newest lines and its progress history, bounded.

Runs of plain lines (``lines.StreamLines``, ``lines.LogRecords``) are kept as they came and made into the
panel's line dicts only when the column is read, and only the newest ``lines_per_rank`` of them: a flood is read
a few times a second, not made line by line.
"""

from __future__ import annotations

from collections import deque

from ..schema.events import LOG, RECORD_LEVEL, RECORD_LOGGER, RECORD_MESSAGE, RECORD_TIME
from ..schema.lines import StreamLines
from ..schema.status import RankStatus

LINES_PER_RANK = 200
HISTORY_POINTS = 200
MAX_TEXT = 2000  # one line's characters in the panel (the run log keeps all of it)


class RankState:
    """What the panel shows of one rank; ``to_json`` is its part of the payload (``labextension/SCHEMA.md``)."""

    def __init__(self, rank: int, lines_per_rank: int):
        self.rank = rank
        self.host: str | None = None
        self.status = RankStatus.STARTING
        self.pid: int | None = None
        self.exit_code: int | None = None
        self._lines: deque = deque(maxlen=lines_per_rank)
        self._unmade: list = []  # (first line number, run start, StreamLines | LogRecords) added since the last read
        self._unmade_count = 0
        self.lines_total = 0
        self.progress: dict | None = None
        self.history: deque = deque(maxlen=HISTORY_POINTS)
        self.history_count = 0  # points ever appended (a delta sends the ones since the last)
        self._last_step: tuple[int, float] | None = None  # (step, time) of the previous report

    @property
    def lines(self) -> deque:
        """The rank's last lines, as the panel shows them. The lines of runs added since the last read are made
        now, and only those kept: a flood of 100,000 lines is shown a few times a second, not line by line."""
        if self._unmade:
            keep, remaining = self._lines.maxlen, self._unmade_count
            for first_number, started, run in self._unmade:
                skip = 0 if keep is None else max(0, min(len(run), remaining - keep))
                remaining -= len(run)
                if skip < len(run):
                    self._lines.extend(_line_dicts(run, first_number, started, skip))
            self._unmade.clear()
            self._unmade_count = 0
        return self._lines

    def add_run(self, first_number: int, started: float, run) -> None:
        """A run of plain lines (``StreamLines``, ``LogRecords``), numbered from ``first_number``: made into the
        panel's lines when they are read (``lines``)."""
        unmade = self._unmade
        unmade.append((first_number, started, run))
        self._unmade_count += len(run)
        keep = self._lines.maxlen
        while keep is not None and len(unmade) > 1 and self._unmade_count - len(unmade[0][2]) >= keep:
            self._unmade_count -= len(unmade.pop(0)[2])  # (every line of it would be pushed out)

    def to_json(self) -> dict:
        return {"rank": self.rank, "host": self.host, "status": self.status, "pid": self.pid,
                "exit_code": self.exit_code, "lines": list(self.lines), "lines_total": self.lines_total,
                "lines_dropped": self.lines_total - len(self.lines), "progress": self.progress,
                "history": list(self.history)}


def _line_dicts(run, first_number: int, started: float, skip: int) -> list[dict]:
    """The panel's lines of a run (``StreamLines`` or ``LogRecords``) but its first ``skip``, as
    ``RunState._add_line`` makes them one by one."""
    if type(run) is StreamLines:
        t, kind = round(max(0.0, run.time - started), 3), run.stream
        return [{"n": first_number + number, "t": t, "kind": kind, "text": text[:MAX_TEXT]}
                for number, text in enumerate(run.texts[skip:], skip)]
    return [{"n": first_number + number, "t": round(max(0.0, frame[RECORD_TIME] - started), 3), "kind": LOG,
             "text": frame[RECORD_MESSAGE][:MAX_TEXT], "level": frame[RECORD_LEVEL], "logger": frame[RECORD_LOGGER]}
            for number, frame in enumerate(run.frames[skip:], skip)]
