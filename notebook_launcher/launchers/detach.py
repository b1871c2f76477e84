"""``notebook_launcher(..., detach=True)``: the run is handed to a supervisor process of its own session
(``detached_supervisor.py``), which outlives this kernel; the call returns a ``DetachedRun`` once the ranks have
started. Where fork is safe (the ranks would be forked) the supervisor is a copy of this kernel, else a fresh
process given the pickled function. What cannot be detached yet is refused here, before any process starts; what
the fresh supervisor cannot load fails the call too, before it returns."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import subprocess
import sys
import warnings

from ..detached import DetachedRun
from ..display.panel import wants_panel
from ..errors import LaunchArgumentError
from ..launch_plan import LaunchPlan
from ..supervision.orphans import starting_for_good
from .payload import spawn_payload

_NOT_CARRIED = ("function", "args", "xla")  # the function and args: inherited, or pickled; XLA is refused


def check_detachable(plan: LaunchPlan, hosts, display) -> None:
    """What a detached run cannot be yet, refused with the parameter that asks for it."""
    if hosts is not None:
        raise LaunchArgumentError("detach=True runs the ranks of this machine only: hosts cannot be detached yet")
    if plan.device == "xla":
        raise LaunchArgumentError('detach=True cannot run device="xla" yet (the XLA runtime is started by one host '
                                  'process of the kernel); use device="cpu" or "cuda", or leave out detach=True')
    if plan.num_nodes > 1:
        raise LaunchArgumentError("detach=True runs one node: num_nodes>1 (each node calling notebook_launcher) "
                                  "cannot be detached yet; leave out detach=True")
    if not isinstance(display, str):
        raise LaunchArgumentError("detach=True draws the run with its own panel: display= must be \"auto\", "
                                  "\"panel\" or \"text\", not a Display object")


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def lifetime(detach_for, detach: bool) -> float | None:
    """``detach_for`` in seconds (a number, or "90s", "30m", "12h", "2d"), checked."""
    if detach_for is None:
        return None
    if not detach:
        raise LaunchArgumentError(f"detach_for={detach_for!r} is the lifetime of a detached run: add detach=True, "
                                  f"or leave out detach_for")
    text = str(detach_for).strip().lower()
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        seconds = -1.0
    if isinstance(detach_for, bool) or not seconds > 0 or seconds == float("inf"):
        raise LaunchArgumentError(f"detach_for={detach_for!r} is not a duration: give seconds (a positive number) "
                                  f"or a string such as \"30m\", \"12h\", \"2d\"")
    return seconds


def _payload(plan: LaunchPlan) -> bytes:
    """The function and args as the supervisor loads them: a process that does not share this kernel's memory."""
    try:
        return spawn_payload(plan.function, plan.args)
    except TypeError as exc:
        text = str(exc).replace("for start_method='spawn'", "for detach=True (a process of its own)")
        text = text.replace(", or use start_method='fork'.", ", or leave out detach=True.")
        raise LaunchArgumentError(text) from None


def start(plan: LaunchPlan, hosts=None, display: str = "auto", detach_for: float | None = None,
          started_timeout: float | None = 300.0) -> DetachedRun:
    """Start the run's supervisor, then return its handle once its ranks started (or it ended first).

    Where the ranks would be forked (``plan.start_method == "fork"``: fork is safe here), the supervisor is a
    copy of this kernel, forked twice into a session of its own: nothing is pickled, and no interpreter starts
    (no ``import torch``). Elsewhere it is a fresh process that loads the pickled function and arguments."""
    check_detachable(plan, hosts, display)
    carried = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name not in _NOT_CARRIED}
    prefix = plan.log_line_prefix_template
    describe = {"device": plan.device, "backend": plan.backend, "start_method": plan.start_method,
                "num_processes": plan.num_processes, "world_size": plan.world_size, "prefix": prefix,
                "ranks": [plan.global_rank(local) for local in range(plan.num_processes)]}
    config = {"plan": json.loads(json.dumps(carried)), "describe": describe, "detach_for": detach_for}
    answer = _fork_supervisor(plan, config) if plan.start_method == "fork" else _spawn_supervisor(plan, config)
    run = DetachedRun(answer["run_dir"], panel=wants_panel(display))
    run.wait_started(started_timeout)
    return run


def _fork_supervisor(plan: LaunchPlan, config: dict) -> dict:
    """The supervisor as a copy of this kernel (``detached_supervisor.run_forked``). The kernel's garbage is
    frozen across the fork, as for a forked rank: none of its finalizers runs in the copy."""
    from .detached_supervisor import run_forked

    read, write = os.pipe()
    gc.freeze()
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns about fork in a threaded process (the kernel is)
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
            with starting_for_good() as spare_group:
                pid = os.fork()
                if pid:
                    spare_group(pid)  # (its session's first process: the supervisor is in its group)
    except BaseException:
        gc.unfreeze()
        os.close(read)
        os.close(write)
        raise
    if pid == 0:  # (the child stays frozen)
        os.close(read)
        run_forked(plan, config, write)  # never returns
    gc.unfreeze()
    os.close(write)
    with contextlib.suppress(ChildProcessError):  # (reaped already, by whoever reaps every child)
        os.waitpid(pid, 0)  # the first child only: the supervisor is its child, and goes on
    with open(read, "rb") as pipe:
        line = pipe.readline()
    return _answer(line, "")


def _spawn_supervisor(plan: LaunchPlan, config: dict) -> dict:
    """The supervisor as a fresh process (``python -m ...detached_supervisor``): the plan and the pickled
    function and arguments on its stdin."""
    payload = _payload(plan)
    config = {**config, "payload_bytes": len(payload)}
    with starting_for_good() as spare_group:
        process = subprocess.Popen([sys.executable, "-m", "notebook_launcher.launchers.detached_supervisor"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=True, cwd=os.getcwd())
        spare_group(process.pid)
    try:
        process.stdin.write(json.dumps(config).encode() + b"\n" + payload)
        process.stdin.close()
    except BrokenPipeError:
        pass
    line = process.stdout.readline()
    process.stdout.close()
    problem = "" if line else process.stderr.read().decode(errors="replace").strip()
    process.stderr.close()
    process.wait()  # (the first process only: the supervisor is its child, and goes on)
    return _answer(line, problem or f"exit code {process.returncode}")


def _answer(line: bytes, problem: str) -> dict:
    """The supervisor's one line: the run's folder, else the error that says why no run began."""
    if not line:
        raise RuntimeError(f"the detached run's supervisor could not start: {problem[-4000:] or 'it ended first'}")
    answer = json.loads(line)
    if "error" not in answer:
        return answer
    told = f"detach=True: the run's supervisor {answer['error']}: {answer['cause']}. No run was started."
    if answer.get("kind") == "payload":
        told += (" What the function and its arguments refer to must load in a fresh process as it does here (a "
                 "module on sys.path, or defined in the notebook); or create it inside the function.")
        raise LaunchArgumentError(f"{told}\n\nIn the supervisor:\n{answer['traceback']}")
    raise RuntimeError(f"{told}\n\nIn the supervisor:\n{answer['traceback']}")
