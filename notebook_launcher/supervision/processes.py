"""The processes of one attempt and every descriptor that watches them, as torch elastic's process context: start
each rank (``starters``), select on their pipes and pidfds, read, reap, signal, and release it all.

It knows nothing of events or of why a run stops: the monitor (``supervisor.Supervisor``) turns what is read into
events and decides. One selector in the launching thread holds each worker's event, stdout and stderr pipes, its
pidfd (readable when it exits) and a wake pipe that a deferred kernel interrupt writes to.
"""

from __future__ import annotations

import os
import selectors
import signal
import time
from typing import TYPE_CHECKING

from ..schema.proctree import current_group, descendants_of_each, kill_if_same
from .handles import WorkerProcess, ask_for_stacks, signal_all
from .orphans import Orphans, spare, unspare
from .starters import start_each_rank, start_xla_host, starter_for

if TYPE_CHECKING:  # (only a type: this layer does not import the plan's module)
    from ..plan import LaunchPlan

DESCENDANT_SCAN_S = 1.0  # how often the processes below each rank are noted (to end them if the rank is killed)
WAKE = "wake"
EXITED = "exited"  # a rank's pidfd became readable (not the "exit" event it then makes)


class RankProcesses:
    """Starts the workers of one plan, then answers which are ready, reads and reaps them, and ends them."""

    def __init__(self, plan: LaunchPlan, store_listen_fd: int = -1):
        self.plan = plan
        self.store_listen_fd = store_listen_fd
        self.workers: list[WorkerProcess] = []
        self._starter = starter_for(plan)
        self._selector = selectors.DefaultSelector()
        self._below: dict[int, dict[int, int]] = {}  # rank -> its descendants when last looked (pid -> start time)
        self._seen: dict[int, int] = {}  # every descendant of a rank ever noted (pid -> start time)
        self._orphans: Orphans | None = None  # this process as the ranks' subreaper, from their start to release
        self._scanned_at = time.monotonic()  # a short launch never pays for a scan
        self.wake_read, self.wake_write = os.pipe()  # written by a deferred interrupt: the select returns at once
        for fd in (self.wake_read, self.wake_write):
            os.set_blocking(fd, False)
        self._selector.register(self.wake_read, selectors.EVENT_READ, (None, WAKE))

    # -- start -------------------------------------------------------------------------------------------------
    def start(self, spec_for) -> list[WorkerProcess]:
        """Every rank (or the XLA host of every ordinal), each with its ``RankSpec`` from ``spec_for(worker,
        pipes)``; the workers in the order started."""
        started = start_xla_host if self.plan.xla is not None else start_each_rank
        self._orphans = Orphans()  # before any rank exists: what one leaves when it dies comes to this process
        for worker, pipes in started(self.plan, self._starter, spec_for, self.store_listen_fd):
            self._watch(worker, pipes)
        return self.workers

    def _watch(self, worker: WorkerProcess, pipes: dict) -> None:
        """A started worker's pipes (their write ends closed here) and its exit, in the selector."""
        for name, (read, write) in pipes.items():
            os.close(write)
            os.set_blocking(read, False)  # lets a reaped worker's pipes be drained without waiting
            worker.read_fds[name] = read
            self._selector.register(read, selectors.EVENT_READ, (worker, name))
        spare(worker.pid)
        if worker.host is None and worker.open_pidfd() is not None:
            self._selector.register(worker.pidfd, selectors.EVENT_READ, (worker, EXITED))
        self.workers.append(worker)

    # -- watch -------------------------------------------------------------------------------------------------
    def ready(self, wait_s: float) -> list[tuple[WorkerProcess, str, int]]:
        """One select of at most ``wait_s``: (worker, channel or EXITED, fd) of each pipe with data and each exit;
        a wake-up is consumed here (the caller checks its interrupt flag after)."""
        ready = []
        for key, _ in self._selector.select(wait_s):
            worker, channel = key.data
            if channel == WAKE:
                while _read_nonblocking(key.fd):
                    pass
            else:
                ready.append((worker, channel, key.fd))
        return ready

    def any_alive(self) -> bool:
        return any(worker.alive for worker in self.workers)

    def any_pipe_open(self) -> bool:
        return any(key.data[1] != WAKE for key in self._selector.get_map().values())

    def read(self, worker: WorkerProcess, channel: str, fd: int, size: int) -> bytes | None:
        """Up to ``size`` bytes of one pipe; None when it had nothing; ``b""`` at its end (then it is closed)."""
        try:
            chunk = os.read(fd, size)
        except BlockingIOError:
            return None
        if not chunk:
            self.forget_pipe(worker, channel, fd)
        return chunk

    def forget_pipe(self, worker: WorkerProcess, channel: str, fd: int) -> None:
        self._selector.unregister(fd)
        os.close(fd)
        del worker.read_fds[channel]

    def note_descendants(self, now: float) -> None:
        """At most every DESCENDANT_SCAN_S: what lies below each live rank, so that what a rank started is ended
        with it even when the rank dies without ending it itself (killed, a crash): its orphans belong to init."""
        if now - self._scanned_at < DESCENDANT_SCAN_S:
            return
        self._scanned_at = now
        live = {worker.pid: worker.rank for worker in self.workers if worker.alive}
        for pid, below in descendants_of_each(list(live)).items():
            self._below[live[pid]] = below
            self._seen.update(below)

    # -- reap and signal ---------------------------------------------------------------------------------------
    def reap(self, worker: WorkerProcess) -> bool:
        """If it has exited: its pidfd closed and what it left behind ended (its group, what was noted below it,
        and what it left to this process, their subreaper); True when it was reaped now."""
        group = current_group(worker.pid) if worker.alive else None  # (read while it cannot be anyone else)
        if not worker.alive or not worker.try_reap():
            return False
        if worker.pidfd is not None:
            self._selector.unregister(worker.pidfd)
            os.close(worker.pidfd)
            worker.pidfd = None
        try:  # whatever it left behind in its group (DataLoader workers) goes with it
            if group not in (None, os.getpgrp()):
                os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        kill_if_same(self._below.pop(worker.rank, {}))  # and what it started outside its group
        if self._orphans is not None:
            self._orphans.end(self._seen)  # and its orphans, now children of this process
        return True

    def without_pidfd(self) -> list[WorkerProcess]:
        """Live workers whose exit no pidfd announces (polled instead)."""
        return [worker for worker in self.workers if worker.alive and worker.pidfd is None]

    def signal_all(self, signum: int, spare=()) -> None:
        signal_all(self.workers, signum, spare)

    def ask_for_stacks(self) -> None:
        """Every live worker prints all its threads' Python stacks (faulthandler on SIGUSR1 → its stderr)."""
        ask_for_stacks(self.workers, self.plan.xla is not None)

    def unregister_all(self) -> None:
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fd)

    def release(self) -> None:
        """Every descriptor closed (the workers already reaped by the monitor's teardown), and nothing the ranks
        left alive: then this process stops being their subreaper."""
        if self._orphans is not None:
            self._orphans.release(self._seen)
        for worker in self.workers:
            unspare(worker.pid)
            for fd in [*worker.read_fds.values()] + ([worker.pidfd] if worker.pidfd is not None else []):
                os.close(fd)
            worker.read_fds.clear()
            worker.pidfd = None
        self._selector.close()
        os.close(self.wake_read)
        os.close(self.wake_write)


def _read_nonblocking(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""
