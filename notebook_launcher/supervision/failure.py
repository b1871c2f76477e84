"""Root cause: which rank really failed first, and one error that says so.

When one rank raises while its peers wait in a collective, the peers fail a moment later with "connection closed
by peer" errors. torch's elastic launcher often blames one of them. Here a failure is *secondary* when its message
is one of those lost-peer errors, and the root cause is the earliest primary failure, falling back to the earliest
failure of any kind. Exceptions are timed by the worker when it reports them; a rank that died without a word is
timed by when it was last heard from (CLOCK_MONOTONIC is one clock for every process on Linux).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from ..schema.cells import cell_names
from ..schema.events import EXIT, FAILURE, STATUS, STREAM, TRUNCATED_EVENT, Event
from ..schema.lines import StreamLines
from .stacks import innermost_user_frame, short_place, torch_place, user_stack

_LOST_PEER = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited|"
    r"DistBackendError|ProcessGroupGloo.*(?:closed|timed out)|pair closure|NCCL communicator was aborted|"
    r"Socket Timeout|recvBytes|Connection refused",
    re.IGNORECASE,
)
LONG_WAIT_S = 2.0  # at a timeout, a rank in a collective for this long counts as waiting, not passing through
_CONTEXT_LINES = 30
_MAX_CRASH_LINES = 1200  # how far back a crash report ("Fatal Python error") is looked for: every thread's dump
_NATIVE_LINES = 20  # how far before it a native library's own report ("terminate called ...") is looked for
_STDERR_KEPT = 2000  # per rank: enough for faulthandler's dump of every thread
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
    oom_retry: dict | None = None  # ran out of memory in find_executable_batch_size: restart at a smaller size
    last_stderr: list = field(default_factory=list)

    @property
    def headline(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


class FailureTracker:
    """Follows one launch attempt's events as they arrive and keeps just what the error messages need: each
    rank's state, first failure, exit, last output line and the tail of its stderr (so the analysis does not
    depend on how many events the run keeps in memory)."""

    def __init__(self):
        self._failures: dict[int, RankFailure] = {}
        self._exits: dict[int, dict] = {}
        self._states: dict[int, str] = {}
        self._last_line: dict[int, str] = {}
        self._stderr: dict[int, deque] = {}
        self._last_seen: dict[int, float] = {}  # when each rank was last heard from

    def observe(self, event: Event) -> None:
        """Every event of the attempt, and every run of lines (``lines.StreamLines``, ``LogRecords``) whole."""
        rank = event.rank
        if event.kind != EXIT:
            self._last_seen[rank] = event.time
        if event.kind == STATUS:
            self._states[rank] = event.data.get("state", self._states.get(rank, "starting"))
        elif type(event) is StreamLines:
            texts = event.texts
            if texts:
                self._last_line[rank] = texts[-1]
            if event.stream == "stderr":
                first = max(0, len(texts) - _STDERR_KEPT)
                self._stderr.setdefault(rank, deque(maxlen=_STDERR_KEPT)).extend(
                    zip(range(event.seq + first, event.seq + len(texts)), texts[first:]))
        elif event.kind == STREAM:
            self._last_line[rank] = event.data["text"]
            if event.data.get("stream") == "stderr" and not event.data.get("redraw"):
                self._stderr.setdefault(rank, deque(maxlen=_STDERR_KEPT)).append((event.seq, event.data["text"]))
        elif event.kind == FAILURE and rank not in self._failures:
            text = f"{event.data.get('type', '')}: {event.data.get('message', '')}"
            self._failures[rank] = RankFailure(
                rank=rank, time=event.time, type=event.data.get("type", "Exception"),
                message=event.data.get("message", ""), traceback=cell_names(event.data.get("traceback", "")),
                exit_code=event.data.get("exit_code"), secondary=bool(_LOST_PEER.search(text)),
                oom_retry=event.data.get("oom_retry"))
        elif event.kind == EXIT:
            self._exits[rank] = event.data
            failure = self._failures.get(rank)
            if failure is not None and failure.type != TRUNCATED_EVENT:
                if failure.exit_code is None:
                    failure.exit_code = event.data.get("exit_code")
            elif not event.data.get("stopped_by_launcher") and (
                    self._states.get(rank) != "finished" or event.data.get("exit_code") != 0):
                # died without finishing, or was killed afterwards (the supervisor's rule too); timed by when the
                # rank was last heard from, on the same clock as the workers' own failure records
                self._failures[rank] = _exit_failure(event, self._last_seen.get(rank, event.time))

    def failures(self) -> dict[int, RankFailure]:
        """One entry per rank that raised, exited without finishing, or was killed (not by the launcher)."""
        for failure in self._failures.values():
            failure.last_stderr = _stderr_context([text for _, text in self._stderr.get(failure.rank, ())])
        return dict(self._failures)

    def last_state(self, rank: int) -> str:
        """What a rank was doing when the run ended, for the "other ranks" part of an error."""
        state = self._states.get(rank, "starting")
        if state == "finished":
            state = "had finished its function (waiting for the others)"
        if self._exits.get(rank, {}).get("stopped_by_launcher"):
            state = f"stopped by the launcher; it {state}" if state.startswith("had") else \
                f"stopped by the launcher while {state}"
        line = self._last_line.get(rank)
        return f"{state}; last output: {line[:200]!r}" if line else state

    def state(self, rank: int) -> str:
        return self._states.get(rank, "starting")

    def stderr_since(self, rank: int, seq: int) -> list[str]:
        return [text for line_seq, text in self._stderr.get(rank, ()) if line_seq > seq]


def _stderr_context(lines: list[str]) -> list[str]:
    """The end of a rank's stderr; for a crash, as a hang's stacks are shown: the native library's own report
    first (gloo's ``terminate called after throwing ... what(): ... Received data size doesn't match``), then
    faulthandler's "Fatal Python error" and the user's frames, ours and the kernel's inherited ones cut with a
    count (``stacks.user_stack``; the run log keeps the whole dump)."""
    for index in range(len(lines) - 1, max(-1, len(lines) - _MAX_CRASH_LINES - 1), -1):
        if lines[index].startswith("Fatal Python error"):
            stack = user_stack(lines[index + 1:])
            return _native_report(lines[:index]) + [lines[index]] + (stack.split("\n") if stack else [])
    return lines[-_CONTEXT_LINES:]


def _native_report(before: list[str]) -> list[str]:
    """What a native library wrote as it aborted, just before faulthandler's report: from a C++ runtime's
    "terminate called" on, else the last few lines."""
    recent = before[-_NATIVE_LINES:]
    for index in range(len(recent) - 1, -1, -1):
        if recent[index].startswith("terminate called"):
            return recent[index:]
    return [line for line in before[-3:] if line.strip()]


def _exit_failure(event: Event, when: float) -> RankFailure:
    signal_name = event.data.get("signal_name")
    code = event.data.get("exit_code")
    if signal_name:
        hint = _SIGNAL_HINTS.get(signal_name, "killed by a signal")
        return RankFailure(rank=event.rank, time=when, type=f"killed by {signal_name}",
                           message=hint, exit_code=code, signal_name=signal_name)
    what = ("before its function returned (os._exit, or a crash in native code)" if code != 0
            else "with code 0 before its function returned (os._exit(0)?)")
    return RankFailure(rank=event.rank, time=when, type=f"exit code {code}", message=f"exited {what}",
                       exit_code=code)


def root_cause(failures: dict[int, RankFailure]) -> RankFailure | None:
    if not failures:
        return None
    return min(failures.values(), key=lambda f: (f.secondary, f.time, f.rank))


def failure_message(cause: RankFailure, failures: dict[int, RankFailure], tracker: FailureTracker,
                    ranks: list[int], run_dir: str) -> str:
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
                lines.append(f"  rank {rank}: {tracker.last_state(rank)}")
            elif (failure.type, failure.message) == (cause.type, cause.message):
                lines.append(f"  rank {rank}: the same {failure.type}")
            else:
                note = " (a consequence: it lost its connection to a failed rank)" if failure.secondary else ""
                lines.append(f"  rank {rank}: {failure.headline.splitlines()[0][:300]}{note}")
    lines += ["", f"Run log: {run_dir}"]
    return cell_names("\n".join(lines))


def hang_message(hang: dict[int, dict], tracker: FailureTracker, stack_dump_seq: dict[int, int],
                 timeout: float | None, run_dir: str, timed_out: bool = False) -> str:
    """Which rank diverged, then where every rank was: its collective (name, number, call site, how long), the
    collective of torch's own its stack shows it in (DDP's reducer, FSDP, ...: ``stacks.torch_place``), or that
    it had finished, and its Python stacks (the user's frames: ``stacks.user_stack``; cells named as IPython
    names them). ``timed_out``: the whole run went past ``timeout``."""
    lines = [f"The run did not finish within timeout={timeout:g} s, so every rank was stopped."] if timed_out else []
    dumps = {rank: tracker.stderr_since(rank, stack_dump_seq[rank]) for rank, info in hang.items()
             if info.get("state") == "running" and rank in stack_dump_seq}
    in_torch = {rank: torch_place(dump) for rank, dump in dumps.items() if not hang[rank].get("inside")}
    in_torch = {rank: label for rank, label in in_torch.items() if label}
    waiting = {rank: info for rank, info in hang.items() if info.get("state") == "running" and info.get("inside")
               and (not timed_out or info["now"] - info["since"] >= LONG_WAIT_S)}
    if waiting or not timed_out:  # (at a timeout, torch's own places count only beside a rank that waits long:
        waiting.update({rank: hang[rank] for rank in in_torch})  # a stack alone says nothing of how long)
    others = {rank: info for rank, info in hang.items() if rank not in waiting}
    member_lists = [info.get("group") if info.get("inside") else None for info in waiting.values()]
    if waiting and None not in member_lists:  # subgroups' collectives: only their members can be missing
        members = set().union(*member_lists)
        others = {rank: info for rank, info in others.items() if rank in members}
    if others:
        culprits = ", ".join(f"rank {rank} {_place(info)}" for rank, info in sorted(others.items()))
        headline = (f"The ranks stopped making progress: {culprits}, while "
                    f"{ranks_text(waiting)} wait{'s' if len(waiting) == 1 else ''} in a collective it will never "
                    f"join. The diverging rank left the loop early or took another code path.")
    else:
        groups: dict[tuple, list[int]] = {}
        for rank, info in waiting.items():
            key = (short_place(in_torch[rank]), None) if rank in in_torch else (info.get("operation"),
                                                                                  info.get("sequence"))
            groups.setdefault(key, []).append(rank)
        if len(groups) > 1:
            said = ", ".join(f"{ranks_text(ranks)} in {where if number is None else f'{where} #{number}'}"
                             for (where, number), ranks in sorted(groups.items(), key=lambda item: item[1]))
            headline = f"The ranks stopped making progress: they wait in different collectives ({said})."
        else:
            who = "every rank waits" if len(waiting) == len(hang) else f"{ranks_text(waiting)} wait"
            headline = f"The ranks stopped making progress: {who} in the same collective."
    if waiting:  # a timeout with nobody stuck in a collective is just a long run: no verdict
        lines.append(headline)
    for rank in sorted(hang):
        lines += ["", f"rank {rank}: {_place(hang[rank], in_torch.get(rank, ''), dumps.get(rank, []))}"]
        stack = user_stack(dumps.get(rank, []))
        if stack:
            lines += [f"  Python stacks of rank {rank}:"] + [f"    {text}" for text in stack.splitlines()]
    lines += ["", f"Run log: {run_dir}"]
    return cell_names("\n".join(lines))


def user_stacks(tracker: FailureTracker, stack_dump_seq: dict[int, int]) -> dict[int, str]:
    """rank -> its stacks as a user reads them (``Run.stacks``, the panel's cards): the user's frames, one line
    saying how many of ours were cut, cells named ``cell In[N]``; the run log keeps every dump whole."""
    stacks = {rank: cell_names(user_stack(tracker.stderr_since(rank, seq))) for rank, seq in stack_dump_seq.items()}
    return {rank: stack for rank, stack in stacks.items() if stack}


def _place(info: dict, in_torch: str = "", dump: list[str] = ()) -> str:
    last = f"{info.get('operation')} #{info.get('sequence')} at {info.get('call_site')}" if info.get("sequence") \
        else "no collective yet"
    if info.get("state") == "finished":
        return f"had finished its function (last collective: {last})"
    if info.get("state") == "exited":
        return f"had exited (last collective: {last})"
    if info.get("inside"):
        last = f"{info.get('operation')} #{info.get('sequence')}{async_wait(info)} at {info.get('call_site')}"
        return f"waiting {info['now'] - info['since']:.1f} s in {last}"
    if in_torch:
        return f"in {in_torch} at {innermost_user_frame(list(dump)) or '?'} (last collective: {last})"
    return f"is not in any collective: busy or stuck in its own code (last collective: {last})"


def async_wait(record: dict) -> str:
    """What follows a collective's name where the rank waits in ``wait()`` for it, launched with
    ``async_op=True`` earlier: " (async, in its wait())"; else ""."""
    return " (async, in its wait())" if record.get("waiting_on_work") else ""


def ranks_text(ranks) -> str:
    """"rank 3" or "ranks 0, 1"."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(rank) for rank in ranks)
