"""The kernel's handle on one rank's process: its pid, pidfd and pipes, and how it ended once reaped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field

from ..schema.proctree import children_of, current_group, descendants, kill

_PF_EXITING = 0x4  # include/linux/sched.h


@dataclass
class WorkerProcess:
    """One rank's process, as the supervisor sees it."""

    rank: int
    local_rank: int
    pid: int = 0
    popen: subprocess.Popen | None = None
    pidfd: int | None = None
    exit_code: int | None = None  # set once reaped (minus the signal that killed it)
    signal: int | None = None
    stopped_by_launcher: bool = False
    sigkill_sent: bool = False
    read_fds: dict = field(default_factory=dict)  # channel name (demux.CHANNELS) -> fd
    host: WorkerProcess | None = None  # an XLA ordinal: the process that carries it (the host's first rank)

    @property
    def alive(self) -> bool:
        return self.exit_code is None and self.signal is None

    def exiting(self) -> bool:
        """Whether the process is already on its way out by itself (the kernel's PF_EXITING flag, from /proc):
        between the moment an exiting rank's sockets close, which its peers notice, and its reaping, it is
        still alive, but no stop of ours is what ended it."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as stat:
                flags = int(stat.read().rsplit(b")", 1)[1].split()[6])
        except (OSError, IndexError, ValueError):
            return False
        return bool(flags & _PF_EXITING)

    def open_pidfd(self) -> int | None:
        """A pidfd (readable once the process exits), where the system has them; None elsewhere (the
        supervisor then polls)."""
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None
        return self.pidfd

    def try_reap(self) -> bool:
        """Reap it if it has exited, without waiting; True when it was reaped now (``exit_code`` is then set).
        A rank carried by another's process ends with that process, as it ended."""
        if self.host is not None:
            if self.host.alive:
                return False
            self.exit_code, self.signal = self.host.exit_code, self.host.signal
            return True
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else (SIGCHLD ignored in this process): status unknown
            pid, status = self.pid, 255 << 8
        else:
            if pid == 0:
                return False
            if self.popen is not None:
                self.popen.returncode = os.waitstatus_to_exitcode(status)
        if os.WIFSIGNALED(status):
            self.signal = os.WTERMSIG(status)
            self.exit_code = -self.signal
        else:
            self.exit_code = os.WEXITSTATUS(status)
        return True

    def exit_data(self) -> dict:
        """The data of its exit event: a rank that died of a signal the launcher did not send (SIGSEGV, SIGABRT,
        an outside SIGKILL) died on its own first, even if the launcher was stopping it."""
        ours = (None, signal.SIGTERM) + ((signal.SIGKILL,) if self.sigkill_sent else ())
        if self.signal not in ours:
            self.stopped_by_launcher = False
        return {"exit_code": self.exit_code, "signal": self.signal, "signal_name": signal_name(self.signal),
                "stopped_by_launcher": self.stopped_by_launcher}


def signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def signal_all(workers: list[WorkerProcess], signum: int, spare=()) -> None:
    """``signum`` to every live worker but the ranks in ``spare``: its descendants, then its process group (the
    one it is in now: it may have made a session of its own), and itself."""
    for worker in workers:
        if worker.alive and worker.rank not in spare and signum == signal.SIGKILL:
            worker.sigkill_sent = True
    alive = [worker.pid for worker in workers if worker.alive and worker.rank not in spare]
    for pid in descendants(alive):
        kill(pid, signum)
    for pid in alive:
        group = current_group(pid)  # (it lives: its group cannot be anyone else's)
        if group not in (None, os.getpgrp()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signum)
        kill(pid, signum)


def ask_for_stacks(workers: list[WorkerProcess], xla: bool) -> None:
    """SIGUSR1 (faulthandler: every thread's Python stack on stderr) to each live worker's process, once each.

    An XLA host waits in xmp.spawn: the processes torch_xla started run the ordinals (one at a time per stream:
    a dump of the host's as well would interleave with its first ordinal's)."""
    asked = set()
    for worker in workers:
        if not worker.alive or worker.pid in asked:
            continue
        asked.add(worker.pid)
        for pid in children_of(worker.pid) if xla else [worker.pid]:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
