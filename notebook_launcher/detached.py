"""A detached run seen from a kernel (``DetachedRun``): what ``notebook_launcher(..., detach=True)`` returns and
``attach(run_id)`` gives back, in any kernel of the same user on this machine.

The run belongs to its supervisor process (``launchers/detached_supervisor.py``); a kernel is only a client of
its socket in the run folder: the run's description, every event so far, then what follows. Several kernels may
follow one run; a kernel that goes away changes nothing for it. Once the run has ended its folder says how
(``outcome.json``) and holds rank 0's return value; a supervisor found gone without an outcome was killed, and the
run is recorded as lost (its ranks died with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from typing import Any

from .detached_channel import Follower, connect
from .errors import DetachedRunError, LaunchTimeoutError, RankFailedError, RunNotFoundError
from .schema.detached_files import (
    LOST,
    OUTCOME,
    RESULT,
    RESULT_HEADER,
    SUPERVISOR,
    process_start,
    read_json,
    write_private,
)
from .schema.events import PROGRESS
from .schema.runfolders import RUN_ID, runs_root
from .schema.runlog import open_run_file

EXIT_S = 10.0  # how long a supervisor whose socket closed may take to be gone, or to have written its outcome
CATCH_UP_S = 30.0  # the most attach() waits for the run's state so far (a loaded machine; it is bytes on a socket)


def _check_folder(run_dir: str, asked: str) -> dict:
    """The run folder is this user's, private, and a detached run's: its ``supervisor.json``."""
    try:
        info = os.stat(run_dir)
    except FileNotFoundError:
        raise RunNotFoundError(f"attach({asked!r}): no run folder {run_dir}. recent_runs(running=True) lists the "
                               f"detached runs that are going on") from None
    if info.st_uid != os.getuid():
        raise PermissionError(f"attach({asked!r}): {run_dir} belongs to another user (uid {info.st_uid}): only "
                              f"its owner can attach to a run")
    try:
        described = read_json(run_dir, SUPERVISOR)
    except ValueError as exc:
        raise RunNotFoundError(f"attach({asked!r}): the run's folder is damaged: {exc}") from None
    if described is None:
        raise RunNotFoundError(f"attach({asked!r}): {run_dir} is not a detached run's folder (no {SUPERVISOR}); "
                               f"inspect_run({asked!r}) shows a run launched in the foreground")
    return described


class DetachedRun:
    """A run that goes on in a supervisor process of its own, whatever happens to this kernel.

    ``status`` ("starting", "running", then "finished", "failed", "hung", "timed out", "interrupted" or "lost"),
    ``progress`` (each rank's last ``report()``), ``result(timeout=None)`` (rank 0's return value, or the error a
    foreground run raises), ``stop()``; displayed in a notebook, the live panel.
    """

    def __init__(self, run_dir: str, asked: str | None = None, panel: bool = False):
        self.run_dir = run_dir
        self.run_id = os.path.basename(run_dir)
        self.described = _check_folder(run_dir, asked or self.run_id)
        self._status = "starting"
        self._outcome: dict | None = None
        self._progress: dict = {}
        self._value: Any = None
        self._has_value = False
        self._ended = threading.Event()
        self._started = threading.Event()
        self._caught_up = threading.Event()
        self._follower = None
        self._panel = None
        idle = None
        connection = connect(run_dir)
        if panel and connection is not None:
            from .detached_panel import new_panel, ticker

            self._panel = new_panel(self)  # fed from this handle's channel, before it marks the run ended
            self._panel_cell = _cell()
            idle = ticker(self._panel)  # (it answers a page that asks while the ranks are quiet)
        if connection is None:
            self._read_outcome()
        else:
            self._follower = Follower(connection, self._on_message, self._on_end, on_idle=idle)
            self._caught_up.wait(CATCH_UP_S)  # its status as the supervisor knows it, before the handle is used

    # -- what the channel says ------------------------------------------------------------------------------------
    def _on_message(self, header: dict, attachment: bytes) -> None:
        if self._panel is not None:
            from .detached_panel import feed

            feed(self._panel, header, attachment)
        if "caught_up" in header:
            self._caught_up.set()
        elif "status" in header:
            self._status = header["status"]
            if self._status != "starting":
                self._started.set()
        elif "event" in header and header["event"][3] == PROGRESS:
            rank, _, _, _, data = header["event"]
            self._progress[rank] = data
        elif "end" in header:
            self._outcome = header["end"]
            self._status = self._outcome.get("status", "failed")
            self._started.set()

    def _on_end(self) -> None:
        self._caught_up.set()
        if self._outcome is None:
            self._read_outcome()
            if self._panel is not None:
                from .detached_panel import feed

                feed(self._panel, {"end": self._outcome}, b"")
        self._started.set()
        self._ended.set()

    def _read_outcome(self) -> None:
        """The run has ended (nothing listens): how, from its folder; without an outcome, it was lost."""
        pid, start = self.described.get("pid"), self.described.get("start")
        deadline = time.monotonic() + EXIT_S
        while True:  # (a killed process closes its socket a moment before it is seen gone)
            try:
                outcome = read_json(self.run_dir, OUTCOME)
            except ValueError as exc:
                outcome = {"status": LOST, "error": {"type": "DetachedRunError", "message": str(exc)}}
            if outcome is not None or process_start(pid) != start or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if outcome is None and not (pid and process_start(pid) == start):
            outcome = {"status": LOST, "error": {"type": "DetachedRunError", "message": (
                f"run {self.run_id} was lost: its supervisor (pid {pid}) ended without finishing it (killed, or "
                f"the machine restarted); its ranks died with it. The run log in {self.run_dir} has what they did")}}
            with contextlib.suppress(OSError):
                write_private(self.run_dir, OUTCOME, json.dumps(outcome).encode())
        if outcome is None:
            outcome = {"status": "running", "error": {"type": "DetachedRunError", "message": (
                f"run {self.run_id}'s supervisor (pid {pid}) is alive but its socket is gone")}}
        self._outcome = outcome
        self._status = outcome.get("status", LOST)
        self._started.set()
        self._ended.set()

    # -- the public handle -----------------------------------------------------------------------------------------
    @property
    def status(self) -> str:
        return self._status

    @property
    def outcome(self) -> dict:
        """How the run ended (``outcome.json``: status, the error), once it has; else its status."""
        return dict(self._outcome or {"status": self._status})

    @property
    def progress(self) -> dict:
        """Each rank's last ``report()`` (step, total, metrics), by rank."""
        return dict(self._progress)

    @property
    def done(self) -> bool:
        return self._ended.is_set()

    def wait_ended(self, timeout: float | None = EXIT_S + CATCH_UP_S) -> bool:
        return self._ended.wait(timeout)

    def wait_started(self, timeout: float | None = None) -> bool:
        """Until the ranks started (or the run ended before they could)."""
        return self._started.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """Rank 0's return value once the run finished; raises what a foreground run raises (``RankFailedError``
        with the root cause first, ``LaunchTimeoutError``), ``DetachedRunError`` if it was stopped or lost, and
        ``TimeoutError`` if it is still going after ``timeout`` seconds."""
        __tracebackhide__ = True
        if not self._ended.wait(timeout):
            raise TimeoutError(f"run {self.run_id} is still {self._status} after {timeout} s: result(timeout=None) "
                               f"waits for its end")
        if self._status == "finished":
            return self._result_value()
        raise self._error()

    def _result_value(self) -> Any:
        from .schema.results import unpack_result

        if not self._has_value:
            header = read_json(self.run_dir, RESULT_HEADER)
            with open_run_file(self.run_dir, RESULT) as source:  # (a regular file of the folder, never a link out)
                self._value = unpack_result(header, source.read())
            self._has_value = True
        return self._value

    def _error(self) -> BaseException:
        error = (self._outcome or {}).get("error") or {}
        kind, text = error.get("type", "DetachedRunError"), error.get("message", f"run {self.run_id} {self._status}")
        if kind == "RankFailedError":
            from .supervision.failure import RankFailure

            cause = error.get("root_cause") or {}
            failure = RankFailure(**cause) if cause else RankFailure(-1, 0.0, kind, text)
            return RankFailedError(text, failure, {failure.rank: failure}, self)
        if kind == "LaunchTimeoutError":
            return LaunchTimeoutError(text, self)
        return DetachedRunError(f"{text} ({kind})" if kind not in ("DetachedRunError", "KeyboardInterrupt")
                                else text, self._status)

    def stop(self, timeout: float | None = 60.0) -> None:
        """End every rank, as an interrupt does, and wait (up to ``timeout`` s) until the run has ended."""
        if self._follower is not None and not self._ended.is_set():
            with contextlib.suppress(OSError):
                self._follower.send({"stop": True})
        self._ended.wait(timeout)

    def close(self) -> None:
        """This kernel stops following the run (the run goes on)."""
        if self._follower is not None:
            with contextlib.suppress(OSError):
                self._follower.connection.shutdown(socket.SHUT_RDWR)
            self._follower.thread.join(timeout=5)

    def _ipython_display_(self) -> None:
        from .detached_panel import show_panel

        if self._panel is not None and self._panel_cell == _cell():
            return  # the launching cell shows its panel already (above)
        show_panel(self)

    def __repr__(self) -> str:
        return f"<DetachedRun {self.run_id} {self._status}: attach({self.run_id!r}); log in {self.run_dir}>"


def _cell() -> int | None:
    """The number of the cell being run (IPython's execution count), None outside IPython."""
    from IPython import get_ipython

    shell = get_ipython()
    return None if shell is None else shell.execution_count


def attach(run_id: str | None = None) -> DetachedRun:
    """A detached run of this user on this machine, by id (or a unique part of one, or its folder; None: the
    newest detached run): its status, result, ``stop()``, and its live panel when displayed. A run that has ended
    gives its outcome and result."""
    if run_id is None:
        return _newest()
    if not isinstance(run_id, (str, os.PathLike)):
        raise TypeError(f"attach(run_id={run_id!r}): expected a run id (a str), as recent_runs(running=True) "
                        f"lists them, not a {type(run_id).__name__}")
    text = os.fspath(run_id)
    if os.sep in text:
        return DetachedRun(text.rstrip(os.sep), text)
    root = runs_root()
    try:
        names = [name for name in os.listdir(root) if RUN_ID.fullmatch(name)]
    except OSError:
        names = []
    matches = [name for name in names if name == text] or [name for name in names if text and text in name]
    if len(matches) != 1:
        why = "no run" if not matches else f"{len(matches)} runs ({', '.join(sorted(matches)[:5])})"
        raise RunNotFoundError(f"attach({text!r}): {why} under {root} match{'es' if not matches else ''} that id; "
                               f"recent_runs(running=True) lists the detached runs that are going on")
    return DetachedRun(os.path.join(root, matches[0]), text)


def _newest() -> DetachedRun:
    root = runs_root()
    try:
        names = sorted((name for name in os.listdir(root) if RUN_ID.fullmatch(name)), reverse=True)
    except OSError:
        names = []
    for name in names:  # (by the id's time stamp, the start of the run)
        if os.path.exists(os.path.join(root, name, SUPERVISOR)):
            return DetachedRun(os.path.join(root, name), name)
    raise RunNotFoundError(f"attach(): there is no detached run under {root}; notebook_launcher(..., detach=True) "
                           f"starts one")


def running_ids() -> list[tuple[str, int]]:
    """(run id, supervisor pid) of this user's detached runs going on under the runs folder, newest first: read
    from their folders (no connection made)."""
    root = runs_root()
    try:
        names = sorted((name for name in os.listdir(root) if RUN_ID.fullmatch(name)), reverse=True)
    except OSError:
        return []
    found = []
    for name in names:
        folder = os.path.join(root, name)
        if not os.path.exists(os.path.join(folder, SUPERVISOR)) or os.path.exists(os.path.join(folder, OUTCOME)):
            continue
        with contextlib.suppress(OSError, ValueError, RunNotFoundError, PermissionError):
            described = _check_folder(folder, name)
            if process_start(described["pid"]) == described["start"]:
                found.append((name, described["pid"]))
            else:
                DetachedRun(folder)  # its supervisor is gone without an outcome: recorded as lost
    return found


def running_runs() -> list[DetachedRun]:
    """The detached runs of this user under the runs folder that are going on, newest first."""
    runs = []
    for name, _ in running_ids():
        with contextlib.suppress(OSError, RunNotFoundError, PermissionError):
            run = DetachedRun(os.path.join(runs_root(), name))
            if not run.done:
                runs.append(run)
    return runs
