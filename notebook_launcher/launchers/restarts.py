"""The policy of attempts, one for every launcher that starts processes (here, or on several hosts).

When an attempt fails, one rule decides whether there is another: an out-of-memory error in
``find_executable_batch_size`` starts every rank again at the smallest size any rank proposes; any other failure
does while ``max_restarts`` allows. Each new attempt is announced by a ``restart`` event, which every display
reads (none parses text). The events themselves go through ``intake.AttemptEvents``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ..plan import LaunchPlan
from ..runs import Run
from ..schema.events import OOM_RETRY, RESTART, Event
from ..supervision.failure import root_cause


class RestartPolicy:
    """Whether a failed attempt is tried again, and with what plan. ``announce``: where its ``oom_retry`` and
    ``restart`` events go (the attempt's ``AttemptEvents.on_event``). ``single_attempt``: never try again here
    (an agent of a launch across hosts: the launching kernel decides new tries for every host)."""

    def __init__(self, run: Run, announce: Callable[[Event], None], single_attempt: bool = False):
        self.run = run
        self.announce = announce
        self.single_attempt = single_attempt
        self.restarts = 0

    def next_plan(self, plan: LaunchPlan, failures: dict, who: str, may_retry: bool = True) -> LaunchPlan | None:
        """After a failed attempt: the plan of the next one, or None (the caller raises). Sets the Run's failures
        and root cause either way. ``may_retry=False``: the attempt cannot be repeated (a host could not run)."""
        run = self.run
        run.failures, run.root_cause = failures, root_cause(failures)
        cause = run.root_cause
        if self.single_attempt or not may_retry:
            return None
        if cause.oom_retry:
            retry = agreed_retry(failures)
            run.oom_retries.append(retry)
            self.announce(Event(rank=cause.rank, seq=0, time=time.monotonic(), kind=OOM_RETRY, data=retry))
            self._restart(cause.rank, "out of memory", retry["new_batch_size"],
                          f"restarting {who} at batch size {retry['new_batch_size']}")
            return dataclasses.replace(plan, batch_sizes={**(plan.batch_sizes or {}),
                                                          retry["key"]: retry["new_batch_size"]})
        if self.restarts >= plan.max_restarts:
            return None
        self.restarts += 1
        self._restart(cause.rank, "failure", None,
                      f"rank {cause.rank} failed ({cause.headline.splitlines()[0][:200]}); restarting {who} "
                      f"({self.restarts} of max_restarts={plan.max_restarts})")
        return plan

    def _restart(self, rank: int, reason: str, batch_size: int | None, text: str) -> None:
        self.announce(Event(rank=rank, seq=0, time=time.monotonic(), kind=RESTART, data={
            "attempt": self.run.attempts + 1, "reason": reason, "batch_size": batch_size, "text": text}))


def agreed_retry(failures: dict) -> dict:
    """One retry for all ranks that ran out of memory at this try: the smallest size any of them proposes."""
    reports = {rank: failure.oom_retry for rank, failure in failures.items() if failure.oom_retry}
    first = min(reports.items(), key=lambda item: item[1]["new_batch_size"])[1]
    return {**first, "ranks": sorted(reports), "new_batch_size": min(r["new_batch_size"] for r in reports.values())}
