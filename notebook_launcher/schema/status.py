"""The states a run and a rank can be in, one name each: the kernel sets them, the panel's JSON carries them, and
the extension's ``RunStatus`` and ``RankStatus`` unions (``labextension/src/schema.ts``) list the same values
(``tests/test_status_contract.py``). Members are strings: they compare equal to, print as and are written to JSON
as their value."""

from __future__ import annotations

from enum import Enum

try:
    from enum import StrEnum
except ImportError:  # Python 3.10
    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return self.value

        def __format__(self, spec: str) -> str:
            return self.value.__format__(spec)


class RunStatus(StrEnum):
    """``Run.status``: where the launch is, then how it ended."""

    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    HUNG = "hung"
    INTERRUPTED = "interrupted"


class RankStatus(StrEnum):
    """A rank's status line in the panel."""

    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STUCK = "stuck"  # waiting when a hang or the timeout stopped the run
    STOPPED = "stopped"  # ended by the launcher because of another rank, not its own fault
    WAITING = "waiting"
    BUSY = "busy"
    IN_DDP = "in DDP"


ENDED = (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.HUNG, RunStatus.INTERRUPTED)


class StopReason(StrEnum):
    """Why the launcher stopped an attempt (``SupervisorOutcome.stop_reason``; None: every rank ended on its own);
    also the panel's ``failure.kind`` (the extension's ``FailureKind``)."""

    FAILURE = "failure"  # a rank raised or exited before finishing its function
    HANG = "hang"  # a rank waits in a collective that a finished rank will never join
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"  # a kernel interrupt (or the stop button)


ENDS_AS = {StopReason.FAILURE: RunStatus.FAILED, StopReason.HANG: RunStatus.HUNG,
           StopReason.TIMEOUT: RunStatus.TIMED_OUT, StopReason.INTERRUPTED: RunStatus.INTERRUPTED}
"""The run's status when an attempt is stopped for each reason: the one bridge between the two spellings."""

_STOPPED_BY = {status: reason for reason, status in ENDS_AS.items()}


def stopped_by(status: str) -> StopReason | None:
    """Why a run that ended with ``status`` was stopped (``ENDS_AS`` read backwards); None: it finished or runs."""
    return _STOPPED_BY.get(status)
