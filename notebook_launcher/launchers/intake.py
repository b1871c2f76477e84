"""Every event of an attempt, in one place: kept on the Run (bounded), written to the run log, followed by the
attempt's FailureTracker, released in order to the display; the result of the last attempt.

The launchers pass each event here as it is read (``AttemptEvents.on_event``, ``on_lines``); whether another
attempt follows is the restart policy's (``attempts.RestartPolicy``), which announces it here too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..runs import Run
from ..schema.events import BALANCE, BATCH_SIZE, EXIT, LOG, RESULT, STREAM, Event
from ..schema.lines import count_lines, expand_lines
from ..schema.results import unpack_result
from ..schema.runlog import RunLog
from ..schema.status import RunStatus
from ..supervision.failure import FailureTracker
from ..supervision.ordering import InOrderRelease

MAX_EVENTS_IN_MEMORY = 200_000  # output and log lines kept on the Run; every event is in the run log


class AttemptEvents:
    """The event intake of one launch's attempts. ``single_attempt``: an agent of a launch across hosts (its
    results are forwarded as they came, and the launching kernel sums up the run)."""

    def __init__(self, run: Run, log: RunLog, display, single_attempt: bool = False):
        self.run = run
        self.log = log
        self.display = display
        self.single_attempt = single_attempt
        self.tracker = FailureTracker()
        self.in_order: InOrderRelease | None = None

    # -- one attempt ------------------------------------------------------------------------------------------
    def begin(self, ranks) -> None:
        """A new attempt of these ranks: a fresh failure tracker and in-order buffer."""
        self.run.attempts += 1
        for results in (self.run.results, self.run.results_left_out, self.run.results_unavailable):
            results.clear()  # what an earlier, failed attempt returned is not this attempt's
        self.tracker = FailureTracker()
        self.in_order = InOrderRelease(list(ranks), self.display.show,
                                       show_lines=getattr(self.display, "show_lines", None))
        self.run.balance_book.clear()
        self.run.status = RunStatus.RUNNING

    def tick(self) -> None:
        """Called by the supervising loop after each wait: in-order lines whose time has come, the display."""
        self.in_order.release()
        self.display.tick()
        self.log.tick()  # a quiet run stays live for pruning

    def end(self) -> None:
        self.in_order.release(everything=True)

    def on_event(self, event: Event) -> None:
        """Every event of the attempt, in the order the kernel read it."""
        run = self.run
        if event.kind == STREAM and event.data.get("redraw"):
            pass  # a progress bar's passing state: in the run log and the panel only
        elif event.kind == RESULT:
            run.events.append(dataclasses.replace(event, attachment=b""))  # the value itself is in run.results
        elif event.kind not in (STREAM, LOG) or len(run.events) < MAX_EVENTS_IN_MEMORY:
            run.events.append(event)
        else:
            run.events_dropped += 1  # output lines beyond the cap are in the run log only
        self.log.write(event)
        self.tracker.observe(event)
        self.in_order.push(event)
        if event.kind == RESULT and not self.single_attempt:  # (an agent forwards results as they came)
            self._receive_result(event)
        elif event.kind == BATCH_SIZE:
            run.batch_sizes[event.data["key"]] = event.data["batch_size"]
        elif event.kind == EXIT:
            run.exit_codes[event.rank] = event.data.get("exit_code")
        elif event.kind == BALANCE:
            run.balance_book.observe(event.rank, event.data)

    def on_lines(self, lines: list) -> None:
        """``on_event`` for plain lines of one rank read together (runs of prints and records, and ``log``
        records without in_order, see ``RankDemux``): each stage takes the whole list at once."""
        run = self.run
        room, count = MAX_EVENTS_IN_MEMORY - len(run.events), count_lines(lines)
        if room >= count:
            run.events.extend_lines(lines)
        else:
            run.events.extend_lines(expand_lines(lines)[:max(0, room)])
            run.events_dropped += count - max(0, room)  # output lines beyond the cap are in the run log only
        self.log.write_lines(lines)
        self.tracker.observe_lines(lines)
        self.in_order.push_lines(lines)

    def _receive_result(self, event: Event) -> None:
        if event.data.get("kept") is False:
            self.run.results_left_out[event.rank] = event.data.get("reason", "")
            return
        try:
            self.run.results[event.rank] = unpack_result(event.data, event.attachment)
        except (Exception, KeyboardInterrupt, SystemExit) as exc:  # noqa: BLE001 - keep supervising; the launch
            # raises it once every rank is done (an interrupt now is the pickle's own: Ctrl-C waits for the loop)
            self.run.results_unavailable[event.rank] = (str(event.data.get("type")), f"{type(exc).__name__}: {exc}")

    def finished(self) -> Any:
        """Every rank of the last attempt finished: rank 0's result (or ResultUnavailableError)."""
        from ..errors import ResultUnavailableError

        run = self.run
        run.failures, run.root_cause = {}, None  # an earlier try's out-of-memory error is in run.oom_retries
        if run.results_unavailable:
            run.status = RunStatus.FAILED
            rank, (type_name, reason) = min(run.results_unavailable.items())
            raise ResultUnavailableError(rank, type_name, reason, run)
        run.status = RunStatus.FINISHED
        if run.oom_retries:
            self.display.note(f"finished at batch size {run.batch_sizes[run.oom_retries[-1]['key']]}")
        if not self.single_attempt:  # (an agent's ranks are only part of the run: the launching kernel says it)
            for line in run.balance.summary().splitlines():
                self.display.note(line)
        return run.result(0)


