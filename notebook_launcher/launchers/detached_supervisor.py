"""The supervisor of a detached run (``notebook_launcher(..., detach=True)``): a process of its own session, not a
child of the kernel, that runs the launch exactly as a kernel does (``driver.launch``: the hang watch, debug
mode, out-of-memory retries, ``max_restarts``, the run log) and serves its events on the run's socket
(``run_server``), as a host's agent (``agent.py``) serves them to a remote kernel over its channel.

Started by ``detach.start`` in one of two ways, both in a new session and a fork away from the kernel (no process
of its tree). Where fork is safe (the ranks are forked), the kernel forks it (``run_forked``): a copy of the kernel,
made a process of its own as a forked rank is (its own streams and signal handlers, none of the kernel's
descriptors, finalizers or runs); nothing is pickled and no interpreter starts. Elsewhere it is
``python -m notebook_launcher.launchers.detached_supervisor`` (``main``): stdin carries one JSON line (the plan,
``payload_bytes``) then the pickled function and arguments, loaded before anything else. Either way the kernel
gets one JSON line back (``Answer``): the run's id and folder once its socket listens, or what failed before any
run began. From then on its own output goes to ``supervisor.log`` in the run folder. It writes rank 0's result
and ``outcome.json`` there, tells its clients, and exits with ``os._exit``: the ranks, which die with their parent
(``PR_SET_PDEATHSIG``), never outlive it.
"""

from __future__ import annotations

import contextlib
import faulthandler
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


class Answer:
    """The one line the kernel waits for on ``fd`` (then closed): the run's id and folder, or why none began."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, message: dict) -> None:
        if self.fd >= 0:
            os.write(self.fd, json.dumps(message).encode() + b"\n")
            os.close(self.fd)
            self.fd = -1

    def refuse(self, what: str, kind: str = "start") -> None:
        """In an ``except`` block, before any answer: what failed, with the traceback's last lines."""
        error = sys.exc_info()[1]
        self.send({"error": what, "kind": kind, "cause": f"{type(error).__name__}: {error}",
                   "traceback": traceback.format_exc()[-4000:]})


def serve(config: dict, make_plan, answer: Answer) -> int:
    """The run: its folder and socket, the answer, then the launch and its outcome. ``make_plan()``: the
    ``LaunchPlan``, function and arguments included."""
    from .driver import launch
    from .run_server import RunServer

    log = RunLog()
    folder_fd = os.open(log.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    hello = {**config["describe"], "run_id": log.run_id, "run_dir": log.path, "pid": os.getpid()}
    server = RunServer(folder_fd, hello, on_stop=lambda: _stop("stop() from a kernel"))
    write_private(log.path, SUPERVISOR, json.dumps({**hello, "start": process_start(os.getpid()),
                                                    "detach_for": config.get("detach_for")}).encode())
    if config.get("detach_for"):
        threading.Thread(target=_lifetime, args=(server, config["detach_for"]), daemon=True,
                         name="detach-for").start()
    output = os.open(log.file("supervisor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((output, 1), (output, 2), (null, 0)):
        os.dup2(fd, target)
    os.close(output)
    os.close(null)
    answer.send({"run_id": log.run_id, "run_dir": log.path})  # the kernel may go: nothing is written to it again
    error: BaseException | None = None
    result_type = None
    try:
        value = launch(make_plan(), BroadcastDisplay(server), log=log)
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


def main() -> int:
    """A fresh process (``python -m``): the plan and the payload on stdin, the answer on stdout."""
    from ..launch_plan import LaunchPlan
    from .agent import _load

    stdin = sys.stdin.buffer
    config = json.loads(stdin.readline())
    payload = stdin.read(config["payload_bytes"])
    answer = Answer(os.dup(1))
    os.dup2(2, 1)  # what loading the payload prints is not the answer
    try:  # before the run's folder exists: what does not load here fails the launch, in the kernel
        function, args = _load(payload)
    except BaseException:  # noqa: BLE001 - whatever the user's objects raise, named to the kernel
        answer.refuse("could not load the function and its arguments sent by the kernel (cloudpickle)", "payload")
        return 1
    try:
        return serve(config, lambda: LaunchPlan(**config["plan"], function=function, args=tuple(args), xla=None),
                     answer)
    except BaseException:  # noqa: BLE001 - before the answer (the run's folder, its socket): to the kernel
        answer.refuse("could not start")
        raise


_kernel_objects: list = []  # the kernel's streams and runs, kept: never finalized in its copy (_as_own_process)


def run_forked(plan, config: dict, answer_fd: int) -> None:
    """In the kernel's child (``detach.start`` where fork is safe): a new session, a fork more (the first child
    exits, reaped by the kernel), then the supervisor, a copy of the kernel made a process of its own. Nothing
    was pickled: the ranks it forks inherit the notebook as a foreground run's do. Never returns."""
    code = 70  # EX_SOFTWARE, if even the setup fails
    try:
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        answer = Answer(answer_fd)
        try:
            _as_own_process(keep=answer_fd)
            threading.current_thread().name = "detached-supervisor"
            code = serve(config, lambda: plan, answer)
        except BaseException:  # noqa: BLE001 - before the answer: to the kernel; after it, the run's outcome
            answer.refuse("could not start")
            traceback.print_exc()
    finally:
        os._exit(code)  # no finalizer, atexit handler or thread of the kernel's runs here


def _as_own_process(keep: int) -> None:
    """This copy of the kernel made a process of its own, as a forked rank is (``rank/worker.py``): the kernel's
    multiprocessing finalizers and signal handlers are not its own, nor its runs (``last_run()`` is this run); its
    output goes to fd 1/2, not through ipykernel's sockets; it holds no descriptor of the kernel's but ``keep`` (a
    restarted kernel binds its ports again while the run goes on)."""
    from ..rank.worker import default_signal_handlers, reset_multiprocessing_after_fork, retarget_logging_handlers
    from ..runs import forget_all
    from ..schema.results import inherit_kernel_main
    from ..supervision.orphans import reset_after_fork

    reset_multiprocessing_after_fork()
    reset_after_fork()  # (the kernel's attempts, running in other threads, are not its own)
    default_signal_handlers()
    signal.set_wakeup_fd(-1)  # the kernel's event loop's, closed below
    # Kept, not let go: a kernel object finalized here (a stream, a run's panel and comm) could write to the
    # kernel's sockets, or close a descriptor number the supervisor has reused. (Its atexit handlers never run:
    # it ends with os._exit.)
    _kernel_objects.extend((forget_all(), sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__, sys.stdin,
                            sys.__stdin__))
    inherit_kernel_main()  # the notebook's classes in rank 0's value are written as the notebook's
    kernel_streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    kept = sorted({0, 1, 2, keep})
    for low, high in zip(kept, kept[1:] + [os.sysconf("SC_OPEN_MAX")]):
        os.closerange(low + 1, high)  # (the null above too)
    sys.stdin = sys.__stdin__ = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    retarget_logging_handlers(kernel_streams)
    if faulthandler.is_enabled():  # (the kernel's file may be closed now)
        faulthandler.enable(file=sys.stderr, all_threads=True)


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
