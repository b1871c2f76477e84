"""How a launch ended, as a value (as torch elastic's ``RunProcsResult``): what a mechanism's ``launch`` returns,
and what ``driver.launch`` alone writes into the Run before it returns the result or raises the error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..schema.status import ENDS_AS, RunStatus, StopReason
from ..supervision.failure import RankFailure, root_cause


@dataclass(frozen=True)
class LaunchOutcome:
    """The end of a launch's last attempt. ``status``: FINISHED (then ``result`` is rank 0's), FAILED, HUNG or
    TIMED_OUT (then ``error`` is what the launch raises; the driver sets its ``run``)."""

    status: RunStatus
    stop_reason: StopReason | None = None  # why the last attempt was stopped; None: its ranks ended on their own
    failures: dict[int, RankFailure] = field(default_factory=dict)  # by rank, of the last attempt
    stuck_ranks: list[int] = field(default_factory=list)  # a hang or the timeout: the ranks still running
    stacks: dict[int, str] = field(default_factory=dict)  # and their stacks, cut to the user's frames
    result: Any = None
    error: BaseException | None = None

    @property
    def root_cause(self) -> RankFailure | None:
        """The first failure that is not a peer's lost connection (``failure.root_cause``)."""
        return root_cause(self.failures)

    @classmethod
    def finished(cls, result: Any) -> LaunchOutcome:
        return cls(RunStatus.FINISHED, result=result)

    @classmethod
    def stopped(cls, reason: StopReason, error: BaseException, **details) -> LaunchOutcome:
        """An attempt stopped for ``reason`` (the run's status follows from it: ``status.ENDS_AS``)."""
        return cls(ENDS_AS[reason], stop_reason=reason, error=error, **details)
