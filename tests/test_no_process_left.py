"""A run leaves no process behind, however what it started detached: a daemon made by a setsid double fork or by
``Popen(start_new_session=True)`` just before its rank returns, aborts or is killed is gone when
``notebook_launcher`` returns, with nothing to wait for; the launching process's own children are untouched; and
``os.setsid()`` works in a rank. Real launches, and one in a real Jupyter kernel."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

import psutil
import pytest
from helpers.kernel import _assert_ok, run_cell, running_kernel

from notebook_launcher import RankFailedError, notebook_launcher
from notebook_launcher.schema.proctree import is_subreaper

RANK_GONE_S = 60  # how long the test's own killer waits for the rank to announce itself (the run ends sooner)


def _alive(pid: int) -> bool:
    """A process with this pid exists, and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pids(folder) -> list[int]:
    """The pids the run's daemons wrote (one file each, written before the rank goes on)."""
    return [int(path.read_text()) for path in folder.glob("*.pid") if path.read_text()]


@contextlib.contextmanager
def daemons_checked(folder):
    """After the block: every daemon the run made is gone, not even a zombie, this process has no child, and it is
    a subreaper as much as before. Whatever failed, a daemon still alive is killed, so a failing test leaves
    nothing."""
    folder.mkdir()
    subreaper = is_subreaper()
    started = time.time() - 1  # (a process's start time is known to a clock tick)
    try:
        yield folder
        pids = _pids(folder)
        assert pids, "the run made no daemon"
        assert [pid for pid in pids if os.path.exists(f"/proc/{pid}")] == []
        assert psutil.Process().children(recursive=True) == []
        assert is_subreaper() == subreaper
    finally:
        for pid in _pids(folder):
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                if process.create_time() >= started:  # still the daemon, not a stranger with its old pid
                    process.kill()


def make_daemon(folder: str, how: str) -> None:
    """A ``sleep 300`` that left this process's group and session; returns once it runs, its pid on file."""
    pid_file = os.path.join(folder, f"{os.getpid()}.pid")
    if how == "double fork":
        if os.fork() == 0:  # the classic daemon: fork, setsid, fork again, the middle one exits
            try:
                os.setsid()
                if os.fork() == 0:
                    with open(pid_file + ".tmp", "w") as out:
                        out.write(str(os.getpid()))
                    os.rename(pid_file + ".tmp", pid_file)
                    os.execvp("sleep", ["sleep", "300"])
            finally:
                os._exit(0)
    else:
        daemon = subprocess.Popen(["sleep", "300"], start_new_session=True)
        with open(pid_file, "w") as out:
            out.write(str(daemon.pid))
    while not os.path.exists(pid_file):
        time.sleep(0.005)


def daemon_then(folder: str, how: str, then: str):
    """Every rank makes a daemon, then: returns at once, aborts, waits to be killed, or (rank 0) fails once
    rank 1's daemon runs, so that the run's stop ends rank 1."""
    import torch.distributed as dist

    rank = dist.get_rank()
    make_daemon(folder, how)
    if then == "returns":
        return rank
    if then == "aborts":
        os.abort()
    if then == "stopped" and rank == 0:
        while len(_pids_in(folder)) < 2:
            time.sleep(0.005)
        raise RuntimeError("rank 0 fails while rank 1's daemon runs")
    with open(os.path.join(folder, f"rank{rank}.tmp"), "w") as out:  # the test's killer may go
        out.write(str(os.getpid()))
    os.rename(os.path.join(folder, f"rank{rank}.tmp"), os.path.join(folder, f"rank{rank}.ready"))
    time.sleep(300)


def _pids_in(folder: str) -> list[str]:
    return [name for name in os.listdir(folder) if name.endswith(".pid")]


def _kill_ranks_when_ready(folder, ranks: int) -> threading.Thread:
    """SIGKILL each rank from outside, as soon as its daemon runs (its pid in ``rank<r>.ready``)."""

    def kill():
        deadline = time.monotonic() + RANK_GONE_S
        killed = set()
        while len(killed) < ranks and time.monotonic() < deadline:
            for ready in set(folder.glob("rank*.ready")) - killed:
                with contextlib.suppress(ProcessLookupError):  # (the run's stop may have ended it first)
                    os.kill(int(ready.read_text()), signal.SIGKILL)
                killed.add(ready)
            time.sleep(0.01)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("how", ["double fork", "new session"])
@pytest.mark.processes
def test_a_daemon_made_as_the_rank_returns_is_gone_after_the_run(how, tmp_path):
    with daemons_checked(tmp_path / "daemons") as folder:
        assert notebook_launcher(daemon_then, args=(str(folder), how, "returns"), num_processes=2,
                                 device="cpu") == 0


@pytest.mark.parametrize("how", ["double fork", "new session"])
@pytest.mark.processes
def test_a_daemon_made_before_the_rank_aborts_is_gone_after_the_run(how, tmp_path):
    with daemons_checked(tmp_path / "daemons") as folder, pytest.raises(RankFailedError, match="SIGABRT"):
        notebook_launcher(daemon_then, args=(str(folder), how, "aborts"), num_processes=2, device="cpu")


@pytest.mark.processes
def test_a_daemon_of_a_rank_killed_from_outside_is_gone_after_the_run(tmp_path):
    with daemons_checked(tmp_path / "daemons") as folder:
        killer = _kill_ranks_when_ready(folder, ranks=2)
        with pytest.raises(RankFailedError, match="SIGKILL"):
            notebook_launcher(daemon_then, args=(str(folder), "double fork", "killed"), num_processes=2,
                              device="cpu")
        killer.join()


@pytest.mark.processes
def test_a_daemon_of_a_rank_the_run_stops_is_gone_after_the_run(tmp_path):
    with daemons_checked(tmp_path / "daemons") as folder, pytest.raises(RankFailedError, match="rank 0 fails"):
        notebook_launcher(daemon_then, args=(str(folder), "double fork", "stopped"), num_processes=2,
                          device="cpu")


@pytest.mark.processes
def test_a_daemon_of_a_spawned_rank_is_gone_after_the_run(tmp_path):
    with daemons_checked(tmp_path / "daemons") as folder, pytest.raises(RankFailedError, match="SIGABRT"):
        notebook_launcher(daemon_then, args=(str(folder), "new session", "aborts"), num_processes=2,
                          device="cpu", start_method="spawn")


def new_session():
    """What a script may do: a session of its own for this process, and a child in it."""
    os.setsid()
    child = subprocess.Popen(["sleep", "300"])
    return os.getpid() == os.getsid(0) == os.getpgid(child.pid), child.pid


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.processes
def test_os_setsid_works_in_a_rank(start_method):
    works, child = notebook_launcher(new_session, num_processes=2, device="cpu", start_method=start_method)
    try:
        assert works
        assert not os.path.exists(f"/proc/{child}")
        assert psutil.Process().children(recursive=True) == []
    finally:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(child).cmdline()[:1] == ["sleep"]:
                psutil.Process(child).kill()


KERNEL_CELL = '''\
import os, subprocess, sys
sys.path.insert(0, {tests!r})
from test_no_process_left import daemon_then
from notebook_launcher import notebook_launcher, RankFailedError
own = subprocess.Popen(["sleep", "60"])           # the kernel's own child, started before the run
try:
    notebook_launcher(daemon_then, args=({folder!r}, "double fork", "aborts"), num_processes=2, device="cpu")
except RankFailedError as error:
    print("failed:", "SIGABRT" in str(error))
print("own alive:", own.poll() is None, own.pid)
'''


@pytest.mark.processes
@pytest.mark.kernel
def test_in_a_kernel_the_runs_daemons_go_and_the_kernels_own_child_stays(tmp_path):
    with daemons_checked(tmp_path / "daemons") as folder, running_kernel(tmp_path) as (_, kc, kernel):
        reply, outputs = run_cell(kc, KERNEL_CELL.format(tests=os.path.dirname(__file__), folder=str(folder)),
                                  timeout=120)
        _assert_ok(reply, outputs)
        text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
        assert "failed: True" in text and "own alive: True" in text, text
        own = int(text.split("own alive: True")[1].split()[0])
        assert [child.pid for child in kernel.children(recursive=True)] == [own]
        assert [pid for pid in _pids(folder) if os.path.exists(f"/proc/{pid}")] == []
        assert _alive(own)
        run_cell(kc, "own.kill(); own.wait()")
        assert kernel.children(recursive=True) == []
