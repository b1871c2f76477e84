"""Process trees on Linux, read from /proc: what lies below a rank, even what left its process group.

Used by the kernel's supervisor (a teardown reaches every descendant; while ranks run it is a subreaper too, and
ends what a rank that died left behind: ``adopted``) and by each worker (it is the subreaper of what it starts,
and ends what is left of it before exiting). Knows nothing of either side.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_PR_SET_PDEATHSIG = 1
END_DESCENDANTS_S = 5.0  # how long a worker keeps ending what lies below it before it exits anyway


def become_subreaper() -> None:
    """Orphans below this process (a double fork with ``setsid``) are re-parented to it instead of to init, so
    they stay its descendants and a teardown still finds them."""
    set_subreaper(True)


def set_subreaper(on: bool) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)
        except (OSError, AttributeError):
            pass


def is_subreaper() -> bool:
    """Whether this process is a child subreaper now (set by whoever started it, or by us)."""
    if not sys.platform.startswith("linux"):
        return False
    flag = ctypes.c_int(0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return bool(flag.value)


def ticks_now() -> int:
    """Now, in the unit of a process's start time in /proc (clock ticks since boot), rounded down."""
    try:
        with open("/proc/uptime", "rb") as uptime:
            seconds = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return int(seconds * os.sysconf("SC_CLK_TCK")) - 1


def current_group(pid: int) -> int | None:
    """The process group ``pid`` is in now (it may have moved: ``os.setsid()``); None once it is gone."""
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def die_with_parent(parent_pid: int) -> None:
    """This process is killed when ``parent_pid`` (its parent) dies, so a crashed kernel leaves no orphan
    training on; if the parent is already gone, it exits now."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(75)


def _table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, start time in clock ticks since boot, process group) of every process."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry)] = (int(fields[1]), int(fields[19]), int(fields[2]))  # ppid, starttime, pgrp
    return table


def descendants(pids) -> dict[int, int]:
    """Every process below ``pids``, including those that left their process group: pid -> start time."""
    pids = list(pids)
    if not pids:
        return {}
    table = _table()
    return _below(pids, table, _children(table))


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    return _children(_table()).get(pid, [])


def descendants_of_each(pids) -> dict[int, dict[int, int]]:
    """``descendants`` of each pid apart, from one look at /proc."""
    table = _table() if pids else {}
    children = _children(table)
    return {pid: _below([pid], table, children) for pid in pids}


def _children(table: dict) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid, (parent, *_) in table.items():
        children.setdefault(parent, []).append(pid)
    return children


def _below(pids: list[int], table: dict, children: dict) -> dict[int, int]:
    found, todo = {}, list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = table[child][1]
            todo.append(child)
    return found


def kill_if_same(processes: dict[int, int], signum: int = signal.SIGKILL) -> None:
    """Signal each pid that still is the process it was (same start time): never a stranger with a reused pid."""
    if not processes:
        return
    table = _table()
    for pid, started in processes.items():
        if table.get(pid, (0, None, 0))[1] == started:
            kill(pid, signum)


def kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _has_children() -> bool:
    """Whether this process has any child, in one system call (``waitid`` with WNOWAIT reaps nothing). As the
    subreaper of what it started, it has one whenever anything lives below it."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except (AttributeError, OSError):
        return True  # no waitid here: look the long way
    return True


def end_own_descendants(wait_s: float = END_DESCENDANTS_S) -> None:
    """SIGKILL everything below this process and reap what became its children (it is their subreaper), again
    until it has no child left: a process forking while it is ended (a daemon's double fork) leaves a new orphan,
    re-parented here. After ``wait_s`` it gives up: what is left goes to the kernel, a subreaper as well."""
    deadline = time.monotonic() + wait_s
    while _has_children():
        for pid in descendants([os.getpid()]):
            kill(pid, signal.SIGKILL)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
        if time.monotonic() >= deadline:
            return
        time.sleep(0.002)


def _own_children() -> set[int] | None:
    """This process's children, from each of its threads' list in /proc; None where the system has none."""
    if not os.path.exists(f"/proc/self/task/{os.getpid()}/children"):
        return None
    children: set[int] = set()
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return None
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/children", "rb") as listed:
                children.update(int(pid) for pid in listed.read().split())
        except OSError:  # (one that ended meanwhile: its children went to another thread, maybe one read before)
            return None
    return children


def adopted(since: int, seen: dict[int, int], spare, spare_groups=()) -> tuple[list[int], list[int]]:
    """What a launch left as children of this process (a subreaper while ranks run), and what lies below them.

    A child is the launch's when it is not in ``spare`` (the ranks themselves), it started at ``since`` or later,
    and it was ``seen`` below a rank (pid -> start time) or it is outside this process's group: a rank's
    descendants are in the rank's group or in one they made, while the subprocesses of the process itself (and
    their orphans) are in its group, unless made in a new session while the launch runs. This process's own
    children are looked at first, and no more when they are all spared (the usual case): an orphan is this
    process's child from before its parent's exit is announced, and one re-parented while the list is read has a
    parent (a child of this process, unspared) that is listed. ``spare_groups``: process groups whose members are
    never the launch's (a detached run's supervisor, re-parented here)."""
    own = _own_children()
    if own is not None and own <= set(spare):
        return [], []
    table = _table()
    children = _children(table)
    own_group = os.getpgrp()
    launched = [pid for pid in children.get(os.getpid(), [])
                if pid not in spare and table[pid][1] >= since and table[pid][2] not in spare_groups
                and (seen.get(pid) == table[pid][1] or table[pid][2] != own_group)]
    return launched, list(_below(launched, table, children))
