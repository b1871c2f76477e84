"""Processes: start one worker per rank, multiplex their pipes, watch their exits, tear down whole trees.

One loop in the launching thread does everything with a selector: each worker's event pipe, stdout pipe, stderr
pipe and pidfd (readable when the worker exits). No helper thread, no signal handler: a kernel interrupt arrives
as KeyboardInterrupt in this loop, which stops every worker before re-raising it.

Workers run in process groups of their own, so a teardown reaches their children (DataLoader workers) and the
SIGINT that Jupyter sends to the kernel's group does not hit them half-way through a collective.
"""

from __future__ import annotations

import dataclasses
import fcntl
import gc
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

from .proctree import descendants, kill, kill_group, kill_if_same
from .results import result_sinks
from .decoding import FrameDecoder, LineSplitter, event_from_frame
from .events import CORRUPT_EVENT_STREAM, EXIT, FAILURE, OUTPUT, STATUS, STREAM, TRUNCATED_EVENT, Event, WorkerSpec
from .progress_record import ProgressRecord

_PIPE_SIZE = 1 << 20  # fewer stalls for chatty workers; the kernel's reads keep up
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
TERMINATE_GRACE_S = 1.0
STACK_DUMP_WAIT_S = 0.5
EOF_WAIT_AFTER_EXIT_S = 1.0
CLOSE_WAIT_S = 5.0
PEER_REPORT_GRACE_S = 1.0  # how long the others may take to raise an error that every rank raises
HANG_GRACE_S = 2.0  # how long ranks may wait in a collective after another rank has finished
DESCENDANT_SCAN_S = 1.0  # how often the processes below each rank are noted (to end them if the rank is killed)


@dataclass
class WorkerProcess:
    """The kernel's handle on one rank."""

    rank: int
    local_rank: int
    pid: int = 0
    popen: subprocess.Popen | None = None
    pidfd: int | None = None
    exit_code: int | None = None  # set once reaped
    signal: int | None = None
    stopped_by_launcher: bool = False
    sigkill_sent: bool = False
    read_fds: dict = field(default_factory=dict)  # name -> fd (events, stdout, stderr)

    @property
    def alive(self) -> bool:
        return self.exit_code is None and self.signal is None


class Supervisor:
    """Starts, watches and stops the workers of one launch attempt.

    ``on_event`` receives every event (worker records, output lines, exits) in the order read; ``on_tick`` is
    called after every wait of at most ``monitor_interval`` (for work that depends on time passing).
    """

    def __init__(self, plan, on_event, spawn_payload_path: str = "", on_tick=None, store_listen_fd: int = -1,
                 progress_dir: str = ""):
        self.plan = plan
        self.progress_dir = progress_dir
        self.progress: dict[int, ProgressRecord] = {}  # rank -> where it is (hang diagnosis)
        self.snapshot: dict = {}  # where each rank was when a hang or the timeout stopped the run
        self.store_listen_fd = store_listen_fd
        self.on_event = on_event
        self.on_tick = on_tick or (lambda: None)
        self.spawn_payload_path = spawn_payload_path
        self.workers: list[WorkerProcess] = []
        self.stop_reason: str | None = None  # "failure" | "timeout" | "interrupted"
        self.stack_dump_seq: dict[int, int] = {}  # rank -> seq at which a stack dump was requested
        self._selector = selectors.DefaultSelector()
        self._decoders: dict[int, FrameDecoder] = {}
        self._splitters: dict[tuple[int, str], LineSplitter] = {}
        self._seq: dict[int, int] = {}
        self._kill_at: float | None = None
        self._eof_deadline: float | None = None
        self._finished_ranks: set[int] = set()
        self._reported_failure: set[int] = set()  # ranks exiting on their own after reporting an exception
        self._stop_at: float | None = None  # a failure every rank raises: stop when all reported, or then
        self._below: dict[int, dict[int, int]] = {}  # rank -> its descendants when last looked (pid -> start time)
        self._scanned_at = time.monotonic()  # a short launch never pays for a scan
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, (None, "wake"))
        self._interrupt = _DeferredInterrupt(None)

    # -- start -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        kernel_fds: list[int] = []  # fds a later forked child must close (earlier ranks' read ends and pidfds)
        for local_rank in range(self.plan.num_processes):
            worker = WorkerProcess(rank=self.plan.global_rank(local_rank), local_rank=local_rank)
            pipes = {name: self._pipe() for name in ("events", "stdout", "stderr")}
            spec = WorkerSpec(
                rank=worker.rank, local_rank=local_rank, world_size=self.plan.world_size,
                local_world_size=self.plan.num_processes, node_rank=self.plan.node_rank,
                device=self.plan.device, backend=self.plan.backend, env=self.plan.env_for(local_rank),
                events_fd=pipes["events"][1], stdout_fd=pipes["stdout"][1], stderr_fd=pipes["stderr"][1],
                parent_pid=os.getpid(), cpu_threads=self.plan.cpu_threads, payload_path=self.spawn_payload_path,
                store_listen_fd=self.store_listen_fd if worker.rank == 0 else -1,
                explicit_store=self.store_listen_fd >= 0, debug=self.plan.debug, results=self.plan.results,
                memory_limit=self.plan.memory_limit,
                progress_path=self._progress_path(worker.rank),
            )
            own_read_ends = [read for read, _ in pipes.values()]
            if self.store_listen_fd >= 0 and worker.rank != 0:
                own_read_ends.append(self.store_listen_fd)  # (closed in the child: only rank 0 serves)
            try:
                if self.plan.start_method == "fork":
                    worker.pid = self._fork(spec, kernel_fds + own_read_ends)
                else:
                    worker.popen = self._spawn(spec)
                    worker.pid = worker.popen.pid
            except BaseException:  # the workers already started are stopped by close()
                for read, write in pipes.values():
                    os.close(read)
                    os.close(write)
                raise
            for name, (read, write) in pipes.items():
                os.close(write)
                os.set_blocking(read, False)  # lets a reaped worker's pipes be drained without waiting
                worker.read_fds[name] = read
                self._selector.register(read, selectors.EVENT_READ, (worker, name))
            kernel_fds += own_read_ends
            worker.pidfd = _pidfd_open(worker.pid)
            if worker.pidfd is not None:
                kernel_fds.append(worker.pidfd)
                self._selector.register(worker.pidfd, selectors.EVENT_READ, (worker, "exit"))
            self._decoders[worker.rank] = FrameDecoder(result_sinks)
            self._splitters[(worker.rank, "stdout")] = LineSplitter()
            self._splitters[(worker.rank, "stderr")] = LineSplitter()
            self.workers.append(worker)

    def _progress_path(self, rank: int) -> str:
        if not self.progress_dir:
            return ""
        path = os.path.join(self.progress_dir, f"progress-{rank}.bin")
        self.progress[rank] = ProgressRecord(path, create=True)
        return path

    def _pipe(self) -> tuple[int, int]:
        read, write = os.pipe()
        try:
            fcntl.fcntl(write, _F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass
        return read, write

    def _fork(self, spec: WorkerSpec, fds_to_close: list[int]) -> int:
        from .worker import run_forked

        # The kernel's garbage is not the child's to collect: its finalizers may wait for threads that do not
        # exist in the child (a c10d store server's destructor joins its thread, and would block forever).
        # Frozen before the fork, so no collection can run in the child first; unfrozen again in the kernel.
        gc.freeze()
        with warnings.catch_warnings():  # Python 3.12+ warns about fork in a threaded process (the kernel is)
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # child: never returns
            run_forked(spec, self.plan.function, self.plan.args, fds_to_close)
        gc.unfreeze()
        try:
            os.setpgid(pid, pid)  # also done by the child; whoever runs first wins the race
        except OSError:
            pass
        return pid

    def _spawn(self, spec: WorkerSpec) -> subprocess.Popen:
        from .worker import SPEC_ENV_VAR

        inherited = (spec.events_fd,) + ((spec.store_listen_fd,) if spec.store_listen_fd >= 0 else ())
        spec_for_child = dataclasses.replace(spec, stdout_fd=1, stderr_fd=2)
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env[SPEC_ENV_VAR] = spec_for_child.to_json()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
        kwargs = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
        return subprocess.Popen(
            [sys.executable, "-c", "from notebook_launcher.worker import main_spawned; main_spawned()"],
            stdin=subprocess.DEVNULL, stdout=spec.stdout_fd, stderr=spec.stderr_fd, pass_fds=inherited,
            env=env, close_fds=True, **kwargs,
        )

    # -- run -------------------------------------------------------------------------------------------------
    def run(self, timeout: float | None, on_started=None) -> None:
        """Start the workers and wait until every one has exited and its pipes are drained.

        Stops everyone on the first failure, at ``timeout`` seconds, or on Ctrl-C / a kernel interrupt, which
        is re-raised as KeyboardInterrupt once all workers are gone (a second one kills them at once). While
        this runs, SIGINT only sets a flag, so an interrupt can never land half-way through a fork, a read or
        a reap; the previous handler is put back before returning.
        """
        with _DeferredInterrupt(self._wake_write) as interrupt:
            self._interrupt = interrupt
            self.start()
            if on_started is not None:
                on_started()
            self._wait(timeout)
        if interrupt.count:
            raise KeyboardInterrupt

    def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._finished():
            self._step(deadline)
            if self._interrupt.count and self.stop_reason != "interrupted":
                self.stop("interrupted", grace=0.5)
                self.stop_reason = "interrupted"
            if self._interrupt.count > 1:
                self._signal_all(signal.SIGKILL)

    def _finished(self) -> bool:
        if any(worker.alive for worker in self.workers):
            return False
        if not any(key.data[1] != "wake" for key in self._selector.get_map().values()):
            return True
        now = time.monotonic()
        if self._eof_deadline is None:
            self._eof_deadline = now + EOF_WAIT_AFTER_EXIT_S
        if now >= self._eof_deadline:  # a descendant that escaped the group still holds a pipe
            self._drain_and_close_all()
            return True
        return False

    def _step(self, deadline: float | None) -> None:
        wait_s = self.plan.monitor_interval
        now = time.monotonic()
        if deadline is not None and self.stop_reason is None:
            wait_s = min(wait_s, max(0.0, deadline - now))
        for moment in (self._kill_at, self._stop_at):
            if moment is not None:
                wait_s = min(wait_s, max(0.0, moment - now))
        self._handle_ready(wait_s)
        self._reap_all_without_pidfd()
        self.on_tick()
        self._check_progress()
        now = time.monotonic()
        if now - self._scanned_at >= DESCENDANT_SCAN_S:
            self._note_descendants(now)
        if self._stop_at is not None and self.stop_reason is None and now >= self._stop_at:
            self.stop("failure")
        if deadline is not None and now >= deadline and self.stop_reason is None:
            self._stop_with_diagnosis("timeout")
        if self._kill_at is not None and now >= self._kill_at:
            self._signal_all(signal.SIGKILL)
            self._kill_at = None

    def _note_descendants(self, now: float) -> None:
        """What lies below each live rank, so that what a rank started is ended with it even when the rank dies
        without ending it itself (killed from outside, a crash): its orphans then belong to init."""
        self._scanned_at = now
        for worker in self.workers:
            if worker.alive:
                self._below[worker.rank] = descendants([worker.pid])

    def _check_progress(self) -> None:
        """A hang: a rank has waited in a collective for HANG_GRACE_S while another rank has already finished
        (it will never join). Then every rank's place is recorded, its Python stacks are collected, and the
        run is stopped. (Any other stall is caught by ``timeout``, with the same diagnosis.)"""
        if self.stop_reason is not None or not self.progress:
            return
        now = time.monotonic()
        done = {w.rank for w in self.workers if not w.alive} | self._finished_ranks
        waits = [now - record["since"] for rank, record in self._records().items()
                 if rank not in done and record["inside"]]
        if not waits:
            return
        if done and max(waits) >= HANG_GRACE_S:
            self._stop_with_diagnosis("hang")

    def _stop_with_diagnosis(self, reason: str) -> None:
        """Record where every rank is (collective, call site, state), collect its Python stacks, then stop."""
        self.stop_reason = reason  # first: a rank killed by the dump signal is not "the failure"
        now = time.monotonic()
        records = self._records()
        self.snapshot = {w.rank: {**records.get(w.rank, {}), "now": now,
                                  "state": "finished" if w.rank in self._finished_ranks else
                                  "exited" if not w.alive else "running"} for w in self.workers}
        self.request_stack_dumps()
        self._collect_for(STACK_DUMP_WAIT_S)
        self.stop(reason)

    def _records(self) -> dict[int, dict]:
        return {rank: record.read() for rank, record in self.progress.items()}

    def _collect_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and any(worker.alive for worker in self.workers):
            self._handle_ready(max(0.0, end - time.monotonic()))

    def _handle_ready(self, wait_s: float) -> None:
        """One select: read every pipe that has data, reap every worker whose pidfd says it exited."""
        for key, _ in self._selector.select(wait_s):
            worker, channel = key.data
            if channel == "wake":  # a SIGINT arrived: the loop checks the flag right after
                while _read_nonblocking(key.fd):
                    pass
            elif channel == "exit":
                self._reap(worker)
            elif worker.read_fds.get(channel) == key.fd:  # not already drained and closed by a reap above
                self._read(worker, channel, key.fd)

    def _read(self, worker: WorkerProcess, channel: str, fd: int) -> bool:
        """Read what one pipe has; False when it had nothing (or reached EOF and was closed)."""
        try:
            chunk = os.read(fd, _PIPE_SIZE)
        except BlockingIOError:
            return False
        if channel == "events":
            decoder = self._decoders[worker.rank]
            was_broken = decoder.broken
            for header, attachment in decoder.feed(chunk):
                self._emit_frame(worker.rank, header, attachment)
            if decoder.broken and not was_broken:  # the pipe is still read (and dropped): the worker never blocks
                self._emit(worker.rank, FAILURE, {
                    "type": CORRUPT_EVENT_STREAM, "message": f"rank {worker.rank} wrote bytes on its event pipe "
                    f"that are not an event ({decoder.broken}); what it sent there after them is lost (its stdout "
                    f"and stderr are not)", "traceback": "", "exit_code": None})
            if not chunk and decoder.pending_bytes:
                self._emit(worker.rank, FAILURE, {
                    "type": TRUNCATED_EVENT, "message": f"{decoder.pending_bytes} bytes of an unfinished event "
                    "(the worker died while writing it)", "traceback": "", "exit_code": None})
        else:
            splitter = self._splitters[(worker.rank, channel)]
            lines = splitter.feed(chunk) if chunk else splitter.finish()
            for line in lines:
                self._emit(worker.rank, STREAM, {"stream": channel, "text": line})
            self._emit_redraw(worker.rank, channel, splitter)
        if not chunk:
            self._selector.unregister(fd)
            os.close(fd)
            del worker.read_fds[channel]
        return bool(chunk)

    def _finish_python_lines(self, rank: int) -> None:
        """A last line the worker printed without a newline."""
        for stream in ("stdout", "stderr"):
            splitter = self._splitters.get((rank, stream, "python"))
            for line in splitter.finish() if splitter else []:
                self._emit(rank, STREAM, {"stream": stream, "text": line})

    def _drain(self, worker: WorkerProcess) -> None:
        """Everything a dead worker wrote is already in its pipes: read it all before reporting its exit."""
        for channel, fd in list(worker.read_fds.items()):
            while worker.read_fds.get(channel) == fd and self._read(worker, channel, fd):
                pass

    def _emit_frame(self, rank: int, header: dict, attachment: bytes) -> None:
        header["rank"] = rank  # the pipe says who wrote it
        if header.get("kind") == OUTPUT:  # Python-level text: cut into lines here, shown as stream events
            data = header.get("data") or {}
            stream = data.get("stream", "stdout")
            splitter = self._splitters.setdefault((rank, stream, "python"), LineSplitter())
            for line in splitter.feed(str(data.get("text", "")).encode("utf-8", "backslashreplace")):
                self._emit(rank, STREAM, {"stream": stream, "text": line})
            self._emit_redraw(rank, stream, splitter)
            return
        self._seq[rank] = self._seq.get(rank, 0) + 1
        event = event_from_frame(header, attachment, self._seq[rank])
        self._deliver(event)

    def _emit_redraw(self, rank: int, stream: str, splitter: LineSplitter) -> None:
        """A line redrawn in place (a progress bar) is passed on as it changes, marked so it is not a new line."""
        latest = splitter.redraw()
        if latest is not None:
            self._emit(rank, STREAM, {"stream": stream, "text": latest, "redraw": True})

    def _emit(self, rank: int, kind: str, data: dict) -> None:
        self._seq[rank] = self._seq.get(rank, 0) + 1
        self._deliver(Event(rank=rank, seq=self._seq[rank], time=time.monotonic(), kind=kind, data=data))

    def _deliver(self, event: Event) -> None:
        self.on_event(event)
        if self.stop_reason is None and self._is_fatal(event):
            if event.data.get("all_ranks_raise") and not self._everyone_reported():
                deadline = time.monotonic() + PEER_REPORT_GRACE_S  # the others are raising the same error
                self._stop_at = deadline if self._stop_at is None else min(self._stop_at, deadline)
            else:
                self.stop("failure")
        elif self._stop_at is not None and self.stop_reason is None and self._everyone_reported():
            self.stop("failure")

    def _everyone_reported(self) -> bool:
        return all(w.rank in self._reported_failure or not w.alive for w in self.workers)

    def _is_fatal(self, event: Event) -> bool:
        """A rank that raised, or that exited without finishing its function (any exit code), ends the run."""
        if event.kind == STATUS and event.data.get("state") == "finished":
            self._finished_ranks.add(event.rank)
        if event.kind == FAILURE:
            self._reported_failure.add(event.rank)
            return True
        if event.kind == EXIT:
            if event.rank in self._reported_failure:
                return False  # its failure already counted; the others may still be raising the same error
            return event.data.get("exit_code") != 0 or event.rank not in self._finished_ranks
        return False

    # -- exits -------------------------------------------------------------------------------------------------
    def _reap(self, worker: WorkerProcess) -> None:
        if not worker.alive:
            return
        status = self._waitpid(worker)
        if status is None:
            return
        if worker.pidfd is not None:
            self._selector.unregister(worker.pidfd)
            os.close(worker.pidfd)
            worker.pidfd = None
        if os.WIFSIGNALED(status):
            worker.signal = os.WTERMSIG(status)
            worker.exit_code = -worker.signal
        else:
            worker.exit_code = os.WEXITSTATUS(status)
        try:  # whatever it left behind in its group (DataLoader workers) goes with it; never by its old pid
            os.killpg(worker.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        kill_if_same(self._below.pop(worker.rank, {}))  # and what it started outside its group
        self._drain(worker)
        self._finish_python_lines(worker.rank)
        ours = (None, signal.SIGTERM) + ((signal.SIGKILL,) if worker.sigkill_sent else ())
        if worker.signal not in ours:
            worker.stopped_by_launcher = False  # it died on its own (SIGSEGV, SIGABRT, an outside SIGKILL) first
        self._emit(worker.rank, EXIT, {"exit_code": worker.exit_code, "signal": worker.signal,
                                       "signal_name": _signal_name(worker.signal),
                                       "stopped_by_launcher": worker.stopped_by_launcher})

    def _waitpid(self, worker: WorkerProcess) -> int | None:
        try:
            pid, status = os.waitpid(worker.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else (SIGCHLD ignored in this process): status unknown
            return 255 << 8
        if pid == 0:
            return None
        if worker.popen is not None:
            worker.popen.returncode = os.waitstatus_to_exitcode(status)
        return status

    def _reap_all_without_pidfd(self) -> None:
        for worker in self.workers:
            if worker.alive and worker.pidfd is None:
                self._reap(worker)

    def _reap_all(self) -> None:
        for worker in self.workers:
            self._reap(worker)

    # -- stop --------------------------------------------------------------------------------------------------
    def request_stack_dumps(self) -> None:
        """Ask every live worker for all its threads' Python stacks (faulthandler on SIGUSR1 → its stderr)."""
        for worker in self.workers:
            if worker.alive:
                self.stack_dump_seq[worker.rank] = self._seq.get(worker.rank, 0)
                try:
                    os.kill(worker.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass

    def stop(self, reason: str, grace: float = TERMINATE_GRACE_S) -> None:
        """SIGTERM every live worker's process group now, SIGKILL after ``grace`` seconds."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._reap_all()  # one that already died on its own keeps its own cause of death
        for worker in self.workers:
            if worker.alive and worker.rank not in self._reported_failure:
                worker.stopped_by_launcher = True
        self._signal_all(signal.SIGTERM, spare=self._reported_failure)  # SIGKILL after the grace takes all
        kill_at = time.monotonic() + grace
        self._kill_at = kill_at if self._kill_at is None else min(self._kill_at, kill_at)

    def _signal_all(self, signum: int, spare=()) -> None:
        for worker in self.workers:
            if worker.alive and worker.rank not in spare and signum == signal.SIGKILL:
                worker.sigkill_sent = True
        alive = [worker.pid for worker in self.workers if worker.alive and worker.rank not in spare]
        for pid in descendants(alive):
            kill(pid, signum)
        for pid in alive:
            kill_group(pid, signum)

    def close(self) -> None:
        """Last resort after wait(): nothing of ours survives, every fd is closed, every child reaped."""
        if any(worker.alive for worker in self.workers):
            self._signal_all(signal.SIGKILL)
            deadline = time.monotonic() + CLOSE_WAIT_S
            while any(worker.alive for worker in self.workers) and time.monotonic() < deadline:
                self._reap_all()
                time.sleep(0.01)
        self._drain_and_close_all()
        for worker in self.workers:
            if worker.pidfd is not None:
                os.close(worker.pidfd)
                worker.pidfd = None
        self._selector.close()
        for record in self.progress.values():
            record.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _drain_and_close_all(self) -> None:
        for worker in self.workers:
            self._drain(worker)
            for channel, fd in list(worker.read_fds.items()):  # held open by an escaped descendant
                splitter = self._splitters.get((worker.rank, channel))
                for line in splitter.finish() if splitter else []:
                    self._emit(worker.rank, STREAM, {"stream": channel, "text": line})
                self._selector.unregister(fd)
                os.close(fd)
                del worker.read_fds[channel]
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fd)


class _DeferredInterrupt:
    """While active (main thread only), SIGINT increments ``count`` and wakes the selector instead of raising
    KeyboardInterrupt wherever the interpreter happens to be. The previous handler is restored on exit."""

    def __init__(self, wake_fd: int | None):
        self.count = 0
        self._wake_fd = wake_fd
        self._previous = None

    def __enter__(self):
        if self._wake_fd is not None and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame):
        self.count += 1
        try:
            os.write(self._wake_fd, b"\0")
        except OSError:
            pass

    def __exit__(self, *exc_info):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


def _read_nonblocking(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def _pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _signal_name(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
