"""The supervisor of a detached run (``notebook_launcher(..., detach=True)``): a process of its own session, not a
child of the kernel, that runs the launch exactly as a kernel does (``driver.launch``: the hang watch, debug
mode, out-of-memory retries, ``max_restarts``, the run log) and serves its events on the run's socket
(``run_server``), as a host's agent (``agent.py``) serves them to a remote kernel over its channel.

Started by ``detach.start`` as ``python -m notebook_launcher.launchers.detached_supervisor`` in a new session, it
forks once more and goes on in the child, so that it is no descendant of the kernel either. stdin carries one
JSON line (the plan, ``payload_bytes``) then the pickled function and arguments; stdout carries one JSON line
back, the run's id and folder, once its socket listens. From then on its own output goes to ``supervisor.log``
in the run folder. It writes rank 0's result and ``outcome.json`` there, tells its clients, and exits: the ranks,
which die with their parent (``PR_SET_PDEATHSIG``), never outlive it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback

from ..runs import last_run
from ..schema.detached_files import OUTCOME, RESULT, RESULT_HEADER, SUPERVISOR, process_start, write_private
from ..schema.events import RESULT as RESULT_EVENT
from ..schema.results import pack_result
from ..schema.runlog import RunLog


class BroadcastDisplay:
    """The launch's display in the supervisor: every event and note to the run's clients, and the run's status
    each time it changes."""

    def __init__(self, server):
        self._server = server
        self._status = None

    def show(self, event) -> None:
        self._check_status()
        attachment = b"" if event.kind == RESULT_EVENT else bytes(event.attachment)  # (the result: in the folder)
        self._server.publish({"event": [event.rank, event.seq, event.time, event.kind, event.data]}, attachment,
                             kind=event.kind)

    def note(self, text: str) -> None:
        self._check_status()
        self._server.publish({"note": text})

    def tick(self) -> None:
        self._check_status()

    def retarget(self, node_rank: int, ranks) -> None:
        pass

    def _check_status(self) -> None:
        run = last_run()
        if run is not None and run.status != self._status:
            self._status = run.status
            self._server.publish({"status": str(run.status)})


def _outcome(run, error: BaseException | None) -> dict:
    """How the run ended, as ``outcome.json`` and the clients' last message keep it."""
    from .driver import _failure_for_panel

    status = str(run.status) if run is not None else "failed"
    outcome: dict = {"status": status, "run_id": run.run_id if run else None}
    if error is None:
        return outcome
    if isinstance(error, KeyboardInterrupt):
        outcome["status"] = "interrupted"
        outcome["error"] = {"type": "KeyboardInterrupt", "message": f"run {outcome['run_id']} was stopped "
                            f"({_stopped_by[0] if _stopped_by else 'interrupted'}): every rank was ended"}
        return outcome
    root = getattr(error, "failure", None)
    outcome["error"] = {"type": type(error).__name__, "message": str(error),
                        "root_cause": json.loads(json.dumps(root.__dict__, default=str)) if root else None,
                        "failures": sorted(getattr(error, "failures", {}) or {})}
    if run is not None:
        outcome["panel_failure"] = _failure_for_panel(run, error)
        outcome["stuck_ranks"] = list(run.stuck_ranks)
    return outcome


def _write_result(folder: str, value) -> None:
    """Rank 0's value as results travel (``pack_result``): its header, then its bytes, owner-only."""
    header, parts = pack_result(value, 0, "rank0")
    write_private(folder, RESULT, b"".join(bytes(part) for part in parts))
    write_private(folder, RESULT_HEADER, json.dumps(header).encode())


_stopped_by: list = []  # why the run was stopped, first reason first


def _stop(reason: str) -> None:
    """End every rank, as an interrupt of a foreground run does (once: a second request changes nothing)."""
    _stopped_by.append(reason)
    if len(_stopped_by) == 1:
        os.kill(os.getpid(), signal.SIGINT)


def _lifetime(server, seconds: float) -> None:
    """``detach_for``: the run is stopped once no client has followed it for ``seconds`` (counted from the start
    while none has come yet)."""
    alone_since = time.monotonic()
    while True:
        time.sleep(min(1.0, seconds / 4))
        if server.clients:
            alone_since = time.monotonic()
        elif time.monotonic() - alone_since >= seconds:
            server.publish({"note": f"no kernel has followed this run for {seconds:g} s (detach_for): stopping it"})
            _stop(f"detach_for={seconds:g} s passed with no kernel following it")
            return


def main() -> int:
    from ..launch_plan import LaunchPlan
    from .agent import _load
    from .driver import launch
    from .run_server import RunServer

    stdin = sys.stdin.buffer
    config = json.loads(stdin.readline())
    payload = stdin.read(config["payload_bytes"])
    log = RunLog()
    folder_fd = os.open(log.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    hello = {**config["describe"], "run_id": log.run_id, "run_dir": log.path, "pid": os.getpid()}
    server = RunServer(folder_fd, hello, on_stop=lambda: _stop("stop() from a kernel"))
    write_private(log.path, SUPERVISOR, json.dumps({**hello, "start": process_start(os.getpid()),
                                                    "detach_for": config.get("detach_for")}).encode())
    if config.get("detach_for"):
        threading.Thread(target=_lifetime, args=(server, config["detach_for"]), daemon=True,
                         name="detach-for").start()
    answer = os.dup(1)
    output = os.open(log.file("supervisor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((output, 1), (output, 2), (null, 0)):
        os.dup2(fd, target)
    os.write(answer, json.dumps({"run_id": log.run_id, "run_dir": log.path}).encode() + b"\n")
    os.close(answer)  # the kernel reads the line and may go: nothing here writes to it again
    error: BaseException | None = None
    result_type = None
    try:
        function, args = _load(payload)
        plan = LaunchPlan(**config["plan"], function=function, args=tuple(args), xla=None)
        value = launch(plan, BroadcastDisplay(server), log=log)
        result_type = type(value).__name__
        _write_result(log.path, value)
    except BaseException as exc:  # noqa: BLE001 - whatever ended the run is its outcome
        error = exc
        traceback.print_exc()
    run = last_run()
    outcome = {**_outcome(run, error), "result_type": result_type}
    if error is not None and run is not None and run.status == "finished":  # the result could not be written
        outcome.update(status="failed", error={"type": type(error).__name__, "message": (
            f"the run finished, but rank 0's result could not be written to {log.path}: {error}. Free space there "
            f"(or set NOTEBOOK_LAUNCHER_RUNS_DIR to a folder with room), or return less (e.g. save the weights "
            f"from rank 0 and return their path)")})
    with contextlib.suppress(OSError):
        write_private(log.path, OUTCOME, json.dumps(outcome, default=str).encode())
    server.publish({"end": outcome})
    server.close()
    return 0


if __name__ == "__main__":
    if os.fork() > 0:  # the kernel reaps this first process at once: the supervisor is no process of its tree
        os._exit(0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.current_thread().name = "detached-supervisor"
    try:
        code = main()
    except BaseException:  # noqa: BLE001 - before the run folder exists: the kernel reads this on stderr
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
