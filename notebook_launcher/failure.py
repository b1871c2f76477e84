"""Root cause: which rank really failed first, and one error that says so.

When one rank raises while its peers wait in a collective, the peers fail a moment later with "connection closed
by peer" errors. torch's elastic launcher often blames one of them. Here a failure is *secondary* when its message
is one of those lost-peer errors, and the root cause is the earliest primary failure (worker-side monotonic time,
which is system-wide on Linux), falling back to the earliest failure of any kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .events import EXIT, FAILURE, STATUS, STREAM, Event

_LOST_PEER = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited|"
    r"DistBackendError|ProcessGroupGloo.*(?:closed|timed out)|pair closure|NCCL communicator was aborted|"
    r"Socket Timeout|recvBytes|Connection refused",
    re.IGNORECASE,
)
_CONTEXT_LINES = 30
_MAX_CRASH_LINES = 120
_SIGNAL_HINTS = {
    "SIGKILL": "killed from outside, often by the out-of-memory killer (check `dmesg`)",
    "SIGSEGV": "a segmentation fault, a crash in native code",
    "SIGABRT": "aborted, usually by a failed check in native code (e.g. mismatched tensor shapes in a collective)",
    "SIGBUS": "a bus error, often a too-small /dev/shm for DataLoader workers",
    "SIGTERM": "terminated from outside",
}


@dataclass
class RankFailure:
    """How one rank ended badly."""

    rank: int
    time: float
    type: str  # exception type name, or "exit code N" / "signal SIGKILL"
    message: str
    traceback: str = ""
    exit_code: int | None = None
    signal_name: str | None = None
    secondary: bool = False  # lost its connection to a rank that failed before it
    last_stderr: list = field(default_factory=list)

    @property
    def headline(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


def rank_failures(events: list[Event]) -> dict[int, RankFailure]:
    """One entry per rank that raised, exited without finishing, or was killed (not by the launcher)."""
    failures: dict[int, RankFailure] = {}
    stderr: dict[int, list[str]] = {}
    finished: set[int] = set()
    for event in events:
        if event.kind == STATUS and event.data.get("state") == "finished":
            finished.add(event.rank)
        elif event.kind == STREAM and event.data.get("stream") == "stderr":
            stderr.setdefault(event.rank, []).append(event.data["text"])
        elif event.kind == FAILURE and event.rank not in failures:
            text = f"{event.data.get('message', '')}\n{event.data.get('traceback', '')}"
            failures[event.rank] = RankFailure(
                rank=event.rank, time=event.time, type=event.data.get("type", "Exception"),
                message=event.data.get("message", ""), traceback=event.data.get("traceback", ""),
                exit_code=event.data.get("exit_code"), secondary=bool(_LOST_PEER.search(text)))
        elif event.kind == EXIT:
            if event.rank in failures:
                failures[event.rank].exit_code = event.data.get("exit_code")
            elif not event.data.get("stopped_by_launcher") and event.rank not in finished:
                failures[event.rank] = _exit_failure(event, stderr.get(event.rank, []))
    for failure in failures.values():
        failure.last_stderr = _stderr_context(stderr.get(failure.rank, []))
    return failures


def _stderr_context(lines: list[str]) -> list[str]:
    """The end of a rank's stderr; for a crash, faulthandler's whole report ("Fatal Python error: ...")."""
    for index in range(len(lines) - 1, max(-1, len(lines) - _MAX_CRASH_LINES - 1), -1):
        if lines[index].startswith("Fatal Python error"):
            return lines[index:]
    return lines[-_CONTEXT_LINES:]


def _exit_failure(event: Event, stderr: list[str]) -> RankFailure:
    signal_name = event.data.get("signal_name")
    code = event.data.get("exit_code")
    if signal_name:
        hint = _SIGNAL_HINTS.get(signal_name, "killed by a signal")
        return RankFailure(rank=event.rank, time=event.time, type=f"killed by {signal_name}",
                           message=hint, exit_code=code, signal_name=signal_name)
    what = ("before its function returned (os._exit, or a crash in native code)" if code != 0
            else "with code 0 before its function returned (os._exit(0)?)")
    return RankFailure(rank=event.rank, time=event.time, type=f"exit code {code}", message=f"exited {what}",
                       exit_code=code)


def root_cause(failures: dict[int, RankFailure]) -> RankFailure | None:
    if not failures:
        return None
    return min(failures.values(), key=lambda f: (f.secondary, f.time, f.rank))


def last_state(events: list[Event], rank: int) -> str:
    """What a rank was doing when the run ended, for the "other ranks" part of an error."""
    last_line, state, exit_data = "", "starting", None
    for event in events:
        if event.rank != rank:
            continue
        if event.kind == STREAM:
            last_line = event.data["text"]
        elif event.kind == STATUS:
            state = event.data.get("state", state)
        elif event.kind == EXIT:
            exit_data = event.data
    parts = [state]
    if exit_data and exit_data.get("stopped_by_launcher"):
        parts = [f"stopped by the launcher while {state}"]
    if last_line:
        parts.append(f"last output: {last_line[:200]!r}")
    return "; ".join(parts)


class RankFailedError(RuntimeError):
    """A rank failed. The message starts with the root-cause rank and its traceback, then the other ranks.

    Attributes: ``rank`` (the root-cause rank), ``failure`` (its RankFailure), ``failures`` (all, by rank),
    ``run`` (the Run, with every event, exit code and the run log directory).
    """

    def __init__(self, message: str, failure: RankFailure, failures: dict, run):
        super().__init__(message)
        self.rank = failure.rank
        self.failure = failure
        self.failures = failures
        self.run = run


class LaunchTimeoutError(TimeoutError):
    """The run went past ``timeout=``; the message holds every live rank's Python stacks at that moment."""

    def __init__(self, message: str, run):
        super().__init__(message)
        self.run = run


def failure_message(cause: RankFailure, failures: dict[int, RankFailure], events: list[Event], ranks: list[int],
                    run_dir: str) -> str:
    lines = [f"Rank {cause.rank} failed first: {cause.headline}"]
    if cause.traceback:
        lines += ["", cause.traceback.rstrip()]
    elif cause.last_stderr:
        lines += ["", f"Last lines of rank {cause.rank}'s stderr:"] + [f"  {text}" for text in cause.last_stderr]
    others = [rank for rank in ranks if rank != cause.rank]
    if others:
        lines += ["", "Other ranks:"]
        for rank in others:
            failure = failures.get(rank)
            if failure is None:
                lines.append(f"  rank {rank}: {last_state(events, rank)}")
            else:
                note = " (a consequence: it lost its connection to a failed rank)" if failure.secondary else ""
                lines.append(f"  rank {rank}: {failure.headline.splitlines()[0][:300]}{note}")
    lines += ["", f"Run log: {run_dir}"]
    return "\n".join(lines)


def timeout_message(timeout: float, events: list[Event], ranks: list[int], stack_dump_seq: dict[int, int],
                    run_dir: str) -> str:
    lines = [f"The run did not finish within timeout={timeout:g} s, so every rank was stopped."]
    for rank in ranks:
        lines += ["", f"rank {rank}: {last_state(events, rank)}"]
        since = stack_dump_seq.get(rank)
        if since is None:
            continue
        dump = [e.data["text"] for e in events if e.rank == rank and e.kind == STREAM and e.seq > since
                and e.data.get("stream") == "stderr"]
        if dump:
            lines += [f"  Python stacks of rank {rank} at the timeout:"] + [f"    {text}" for text in dump]
    lines += ["", f"Run log: {run_dir}"]
    return "\n".join(lines)
