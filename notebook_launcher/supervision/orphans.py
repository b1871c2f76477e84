"""What a rank leaves behind when it dies before ending it, found and ended by the launching process.

Each worker is the subreaper of what it starts and ends all of it before it exits (``proctree``), but a rank
that is killed (SIGKILL, the run's stop) or aborts cannot: its orphans go to the nearest subreaper above it, and
without one that is init, beyond the kernel's reach (a snapshot of each rank's descendants, once a second,
misses a daemon made just before). So while an attempt's ranks run, the kernel itself is a child subreaper
(``PR_SET_CHILD_SUBREAPER``): whatever a dead rank leaves is re-parented to the kernel, atomically before its
exit is announced, and stays there whatever it does next (forks, ``setsid``), so nothing can escape; the kernel
kills it and everything below it, and reaps it. A subreaper of its own process rather than a check at exit is
what also holds when the worker has no chance to clean up.

A kernel has children of its own (the notebook's subprocesses, and, while it is a subreaper, their orphans),
which must survive a launch: ``proctree.adopted`` takes only children that started during the attempt and were
seen below a rank or are outside the kernel's process group. The previous subreaper state is put back when the
last attempt of this process is released.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from ..schema.proctree import adopted, is_subreaper, kill, set_subreaper, ticks_now

_lock = threading.Lock()
_holders = 0  # attempts of this process now running (launches in other threads included)
_was_subreaper = False
_spared: set[int] = set()  # pids of every running attempt's ranks and group leaders: never taken for orphans
_spared_groups: set[int] = set()  # process groups of detached runs' supervisors started here: never orphans
RELEASE_WAIT_S = 5.0  # how long the end of an attempt keeps ending what its ranks left (SIGKILLed: it is quick)


def spare(pid: int) -> None:
    """``pid`` (a rank, a group leader) is the launch's own child, not something it left."""
    _spared.add(pid)


def unspare(pid: int) -> None:
    _spared.discard(pid)


@contextlib.contextmanager
def starting_for_good():
    """Around starting a process in a new session of its own that must outlive every attempt (a detached run's
    supervisor): no attempt looks for orphans meanwhile, and the ``spare_group`` given is called with the new
    process group's id (the pid of the session's first process) before any can. Without it, the supervisor,
    re-parented to this process while it is a subreaper (another thread's launch running), would be taken for
    what that launch left, and killed."""
    with _lock:
        yield _spared_groups.add


def reset_after_fork() -> None:
    """In a fork of this process that lives on as a process of its own (a detached run's supervisor): none of the
    parent's attempts is its own, and the subreaper setting, which a fork does not inherit, is to be made anew."""
    global _holders, _was_subreaper, _lock
    _lock = threading.Lock()  # (a copy of one another thread may have held at the fork)
    _holders, _was_subreaper = 0, False
    _spared.clear()
    _spared_groups.clear()


class Orphans:
    """This process as the subreaper of one attempt's ranks: ``end()`` after each rank is reaped, ``release()``
    once all are."""

    def __init__(self):
        global _holders, _was_subreaper
        self._since = ticks_now()
        self._killed: set[int] = set()  # children of ours killed, not reaped yet
        with _lock:
            if _holders == 0:
                _was_subreaper = is_subreaper()
                set_subreaper(True)
            _holders += 1
        self._held = True

    def end(self, seen: dict[int, int]) -> bool:
        """One round, without waiting: SIGKILL what the ranks left that is now a child of ours and everything below
        it, and reap what has exited; ``seen``: pid -> start time of the ranks' descendants once noted. False
        once a round finds nothing of the attempt (one that killed something is followed by another: a process
        killed as it forked leaves a new orphan)."""
        with _lock:  # (not while a process that must outlive the attempt is being started: starting_for_good)
            launched, below = adopted(self._since, seen, set(_spared), set(_spared_groups))
        for pid in launched + below:  # children first: an unreaped child's pid cannot be anyone else's
            kill(pid, signal.SIGKILL)
        self._killed.update(launched)
        for pid in list(self._killed):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._killed.discard(pid)
        return bool(launched or below or self._killed)

    def release(self, seen: dict[int, int]) -> None:
        """Ends what is left (bounded by RELEASE_WAIT_S), then puts back the subreaper state found, if no other
        attempt of this process still runs."""
        global _holders
        if not self._held:
            return
        deadline = time.monotonic() + RELEASE_WAIT_S
        while self.end(seen) and time.monotonic() < deadline:
            time.sleep(0.002)
        self._held = False
        with _lock:
            _holders -= 1
            if _holders == 0 and not _was_subreaper:
                set_subreaper(False)
