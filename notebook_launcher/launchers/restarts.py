"""The restart policy, one for every launcher that starts processes (here, or on several hosts).

When an attempt fails, one rule decides whether there is another: an out-of-memory error in
``find_executable_batch_size`` starts every rank again at the smallest size any rank proposes; any other failure
does while ``max_restarts`` allows. Each new attempt is announced by a ``restart`` event, which every display
reads (none parses text). The events themselves go through ``intake.EventIntake``, which keeps them on the Run;
the policy itself writes nothing there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from ..plan import LaunchPlan
from ..schema.events import OOM_RETRY, RESTART, Event
from ..supervision.failure import root_cause


class RestartPolicy:
    """Whether a failed attempt is tried again, and with what plan. ``announce``: where its ``oom_retry`` and
    ``restart`` events go (``EventIntake.on_event``). ``single_attempt``: never try again here (an agent of a
    launch across hosts: the launching kernel decides new tries for every host). One policy per launch."""

    def __init__(self, announce: Callable[[Event], None], single_attempt: bool = False):
        self.announce = announce
        self.single_attempt = single_attempt
        self.restarts = 0  # granted for other failures (bounded by max_restarts)
        self.attempt = 1  # the attempt now running: each plan given adds one

    def next_plan(self, plan: LaunchPlan, failures: dict, who: str, may_retry: bool = True) -> LaunchPlan | None:
        """After a failed attempt (``failures``, by rank): the plan of the next one, or None (the launch ends
        failed). ``may_retry=False``: the attempt cannot be repeated (a host could not run)."""
        cause = root_cause(failures)
        if self.single_attempt or not may_retry:
            return None
        if cause.oom_retry:
            retry = agreed_retry(failures)
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
        self.attempt += 1
        self.announce(Event(rank=rank, seq=0, time=time.monotonic(), kind=RESTART, data={
            "attempt": self.attempt, "reason": reason, "batch_size": batch_size, "text": text}))


def agreed_retry(failures: dict) -> dict:
    """One retry for all ranks that ran out of memory at this try: the smallest size any of them proposes."""
    reports = {rank: failure.oom_retry for rank, failure in failures.items() if failure.oom_retry}
    first = min(reports.items(), key=lambda item: item[1]["new_batch_size"])[1]
    return {**first, "ranks": sorted(reports), "new_batch_size": min(r["new_batch_size"] for r in reports.values())}
