"""Processes a test starts and the checks that none is left."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys

import psutil


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def no_children_left() -> None:
    """Nothing the test started is still a child of this process (not even a zombie)."""
    assert psutil.Process().children(recursive=True) == []


def _kill_leftovers(processes) -> None:
    """Last resort for a failed test: SIGKILL what is still ours (psutil checks the PID was not reused)."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(list(processes), timeout=5)


def run_in_session(command, timeout: float, env=None) -> subprocess.CompletedProcess:
    """``command`` in a session of its own, its output captured; the session is killed whole at the end, whatever
    happened (what it started too, if it overran or left something)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_torchrun(script, *script_args, nproc: int = 2, timeout: float = 120):
    """``torchrun --standalone`` on a script, in a session of its own that is killed whole if it overruns."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return run_in_session([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                           str(script), *map(str, script_args)], timeout, env)
