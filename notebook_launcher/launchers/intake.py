"""Every event of an attempt, in one place: kept on the Run (bounded in bytes), written to the run log, followed
by the attempt's FailureTracker, released in order to the display; the result of the last attempt. The intake
writes into the Run what the events say (events, results, exit codes, batch sizes, out-of-memory retries, the
attempt count); how the launch ended is the mechanism's ``LaunchOutcome``, which ``driver.launch`` writes.

The Run keeps at most ``MAX_BYTES_IN_MEMORY`` of events, each counted by what it holds (``lines.EventList``:
lines, log records, displays with their metadata); the story of the run (``KEPT_ALWAYS``: status, failures,
exits, results, restarts, hang notices) is kept whatever the bound. What goes past the bound is in the run log
only, and one note at the run's end says how much and how to read it (``note_left_out``).

The launchers pass each event here as it is read (``EventIntake.on_event``; a run of lines as one); whether another
attempt follows is the restart policy's (``restarts.RestartPolicy``), which announces it here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..display.protocol import shown_whole
from ..runs import Run
from ..schema.events import (
    BALANCE,
    BATCH_SIZE,
    EXIT,
    FAILURE,
    HANG_NOTICE,
    LAUNCHER,
    OOM_RETRY,
    RESTART,
    RESULT,
    STATUS,
    STREAM,
    Event,
)
from ..schema.lines import RUNS, event_bytes, lines_bytes
from ..schema.results import unpack_result
from ..schema.runlog import RunLog
from ..schema.status import RunStatus
from ..supervision.failure import FailureTracker
from ..supervision.ordering import InOrderRelease
from .outcome import LaunchOutcome

MAX_BYTES_IN_MEMORY = 64 * 2**20  # events kept on the Run (Run.events.bytes); every event is in the run log
KEPT_ALWAYS = frozenset((STATUS, RESULT, FAILURE, EXIT, LAUNCHER, RESTART, OOM_RETRY, BATCH_SIZE, HANG_NOTICE))


class EventIntake:
    """The event intake of one launch's attempts. ``single_attempt``: an agent of a launch across hosts (its
    results are forwarded as they came, and the launching kernel sums up the run). ``started``: called as each
    attempt begins (the driver's: the run is running)."""

    def __init__(self, run: Run, log: RunLog, display, single_attempt: bool = False,
                 started: Callable[[], None] = lambda: None):
        self.run = run
        self.log = log
        self.display = display
        self.single_attempt = single_attempt
        self.started = started
        self.tracker = FailureTracker()
        self.in_order: InOrderRelease | None = None
        self._left_out_noted = False
        self._memory_failed_noted = False  # said once a run: a result that could not be written in memory

    # -- one attempt ------------------------------------------------------------------------------------------
    def begin(self, ranks) -> None:
        """A new attempt of these ranks: a fresh failure tracker and in-order buffer."""
        self.run.attempts += 1
        for results in (self.run.results, self.run.results_left_out, self.run.results_unavailable):
            results.clear()  # what an earlier, failed attempt returned is not this attempt's
        self.tracker = FailureTracker()
        self.in_order = InOrderRelease(list(ranks), shown_whole(self.display))
        self.run.balance_book.clear()
        self.started()

    @property
    def attempts(self) -> int:
        """The attempts begun so far."""
        return self.run.attempts

    @property
    def run_dir(self) -> str:
        """The run's folder (the run log), for the messages that name it."""
        return self.run.run_dir

    def tick(self) -> None:
        """Called by the supervising loop after each wait: in-order lines whose time has come, the display."""
        self.in_order.release()
        self.display.tick()
        self.log.tick()  # a quiet run stays live for pruning

    def end(self) -> None:
        self.in_order.release(everything=True)

    def on_event(self, event: Event) -> None:
        """Every event of the attempt, in the order the kernel read it; a run of lines (``lines.StreamLines``,
        ``LogRecords``) is one, which each stage takes whole."""
        run = self.run
        if type(event) in RUNS:
            self._keep_run(event)
        elif event.kind == STREAM and event.data.get("redraw"):
            pass  # a progress bar's passing state: in the run log and the panel only
        elif event.kind == RESULT:
            run.events.append(dataclasses.replace(event, attachment=b""))  # the value itself is in run.results
        elif event.kind in KEPT_ALWAYS:
            run.events.append(event)
        else:
            size = event_bytes(event)
            if not run.events_dropped and run.events.bytes + size <= MAX_BYTES_IN_MEMORY:
                run.events.append(event)
            else:
                self._leave_out(1, size)
        self.log.write(event)
        self.tracker.observe(event)
        self.in_order.push(event)
        if event.kind == RESULT and not self.single_attempt:  # (an agent forwards results as they came)
            self._receive_result(event)
        elif event.kind == BATCH_SIZE:
            run.batch_sizes[event.data["key"]] = event.data["batch_size"]
        elif event.kind == OOM_RETRY:
            run.oom_retries.append(event.data)
        elif event.kind == EXIT:
            run.exit_codes[event.rank] = event.data.get("exit_code")
        elif event.kind == BALANCE:
            run.balance_book.observe(event.rank, event.data)

    def _keep_run(self, lines) -> None:
        """A run of lines on the Run, as one tuple (``EventList.extend_lines``), or its lines before the bound."""
        run = self.run
        size = lines_bytes((lines,))
        if run.events_dropped:
            self._leave_out(len(lines), size)
        elif run.events.bytes + size <= MAX_BYTES_IN_MEMORY:
            run.events.extend_lines((lines,), size)
        else:  # the bound falls inside these lines: the Run keeps those before it
            events = lines.events()
            kept = 0
            for event in events:
                one = lines_bytes((event,))
                if run.events.bytes + one > MAX_BYTES_IN_MEMORY:
                    break
                run.events.extend_lines((event,), one)
                kept += 1
            self._leave_out(len(events) - kept, lines_bytes(events[kept:]))

    def _leave_out(self, count: int, size: int) -> None:
        """Events past the Run's bound: in the run log only, from the first on (``Run.events`` stays the run's
        beginning, whole)."""
        self.run.events_dropped += count
        self.run.events_dropped_bytes += size

    def note_left_out(self) -> None:
        """Once, at the run's end: how much the Run did not keep in memory, and where it is."""
        run = self.run
        if self._left_out_noted or not run.events_dropped:
            return
        self._left_out_noted = True
        self.display.note(f"{run.events_dropped_bytes / 2**20:.1f} MB of output ({run.events_dropped} events) past "
                          f"the in-memory bound of {MAX_BYTES_IN_MEMORY // 2**20} MB a run are in the run log "
                          f"only: inspect_run({run.run_id!r})")

    def keep_result(self, rank: int, value: Any) -> None:
        """A rank's return value that came without an event (the function run in the kernel)."""
        self.run.results[rank] = value

    def _receive_result(self, event: Event) -> None:
        if event.data.get("memory_failed") and not self._memory_failed_noted:
            self._memory_failed_noted = True
            self.display.note(f"rank {event.rank}'s result came through its pipe, not shared memory "
                              f"({event.data['memory_failed']})")
        if event.data.get("kept") is False:
            self.run.results_left_out[event.rank] = event.data.get("reason", "")
            return
        try:
            self.keep_result(event.rank, unpack_result(event.data, event.attachment))
        except (Exception, KeyboardInterrupt, SystemExit) as exc:  # noqa: BLE001 - keep supervising; the launch
            # raises it once every rank is done (an interrupt now is the pickle's own: Ctrl-C waits for the loop)
            self.run.results_unavailable[event.rank] = (str(event.data.get("type")), f"{type(exc).__name__}: {exc}")

    def finished(self) -> LaunchOutcome:
        """Every rank of the last attempt finished: rank 0's result (or ResultUnavailableError)."""
        from ..errors import ResultUnavailableError

        run = self.run
        if run.results_unavailable:
            rank, (type_name, reason) = min(run.results_unavailable.items())
            return LaunchOutcome(RunStatus.FAILED, error=ResultUnavailableError(rank, type_name, reason))
        if run.oom_retries:
            self.display.note(f"finished at batch size {run.batch_sizes[run.oom_retries[-1]['key']]}")
        if not self.single_attempt:  # (an agent's ranks are only part of the run: the launching kernel says it)
            for line in run.balance.summary().splitlines():
                self.display.note(line)
        return LaunchOutcome.finished(run.result(0))


