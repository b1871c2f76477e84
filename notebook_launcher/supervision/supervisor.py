"""The monitor of one attempt: the loop that turns what the workers write into events, watches for failures,
hangs, the timeout and interrupts, and stops everyone; it returns what the attempt came to (``SupervisorOutcome``)
once everything it started is gone.

The processes themselves (start, pipes, pidfds, reaping, signals, every descriptor) are ``processes.RankProcesses``,
as torch elastic's process context; a rank's bytes become events in its ``demux.RankDemux``. Everything runs in the
launching thread, around one select: no helper thread, no signal handler of its own while it is not running. A
kernel interrupt is deferred (``interrupts``) to this loop, which stops every worker before raising
KeyboardInterrupt.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..schema.events import EXIT, FAILURE, HANG_NOTICE, RESULT, STATUS, Event
from ..schema.rank_spec import RankSpec
from ..schema.result_memory import IN_MEMORY_FROM, ResultFiles, files_for
from ..schema.status import StopReason
from .demux import RankDemux
from .handles import WorkerProcess
from .hangs import HangWatch, StallWatch
from .interrupts import DeferredInterrupt
from .processes import EXITED, RankProcesses
from .starters import PIPE_SIZE

if TYPE_CHECKING:  # (only a type: this layer does not import the plan's module)
    from ..plan import LaunchPlan

TERMINATE_GRACE_S = 1.0
STACK_DUMP_WAIT_S = 0.5
EOF_WAIT_AFTER_EXIT_S = 1.0
CLOSE_WAIT_S = 5.0
PEER_REPORT_GRACE_S = 1.0  # how long the others may take to raise an error that every rank raises


@dataclass(frozen=True)
class SupervisorOutcome:
    """What one attempt came to, returned once every worker is gone and every fd is closed.

    What each rank said (its result, its failure) went to ``on_event`` as it was read; this is what only the
    supervisor knows: why it stopped the run and, for a hang or the timeout, where every rank was.
    """

    stop_reason: StopReason | None  # None: every rank ended on its own
    ranks: list[int]  # the global ranks started, in order
    exit_codes: dict[int, int | None]  # rank -> exit code, minus the signal that killed it; None if never reaped
    snapshot: dict[int, dict] = field(default_factory=dict)  # hang/timeout: rank -> its progress record and state
    stack_dump_seq: dict[int, int] = field(default_factory=dict)  # rank -> its last seq before its stacks were asked


@dataclass
class _Moments:
    """The monitor's deadlines (monotonic seconds; None: none set)."""

    run_ends: float | None = None  # the timeout
    stop_at: float | None = None  # a failure every rank raises: stop when all reported, or then
    kill_at: float | None = None  # SIGKILL what the SIGTERM left
    pipes_close_at: float | None = None  # every worker gone: pipes an escaped descendant holds are given up

    def soonest(self, now: float, longest: float, stopping: bool) -> float:
        """How long the next wait may be: ``longest``, or until the next moment (not the timeout once stopping)."""
        moments = (self.stop_at, self.kill_at) if stopping else (self.run_ends, self.stop_at, self.kill_at)
        return min([longest, *(max(0.0, moment - now) for moment in moments if moment is not None)])


class Supervisor:
    """Watches and stops the workers of one launch attempt; ``run()`` once.

    ``on_event`` receives every event (worker records, output lines, exits) in the order read, a run of plain
    lines read together as one (``lines.StreamLines``, ``LogRecords``, see ``RankDemux``); ``on_tick`` is called
    after every wait of at most ``monitor_interval`` (for work that depends on time passing).
    """

    def __init__(self, plan: LaunchPlan, on_event, spawn_payload_path: str = "", on_tick=None,
                 store_listen_fd: int = -1, progress_dir: str = ""):
        self.plan = plan
        self.on_event = on_event
        self.on_tick = on_tick or (lambda: None)
        self.spawn_payload_path = spawn_payload_path
        self.store_listen_fd = store_listen_fd
        self._processes = RankProcesses(plan, store_listen_fd)
        self._workers: list[WorkerProcess] = self._processes.workers
        self._demux: dict[int, RankDemux] = {}  # rank -> its pipes' events
        self._hangs = HangWatch(progress_dir)  # where each rank is (hang diagnosis)
        # large results in memory, from ranks on this machine to the kernel (an agent's go on through its channel)
        self._result_files = ResultFiles(enabled=not plan.in_workers)
        # the stall watchdog; not on an agent of a launch across hosts (in_workers), which sees only its host's ranks
        self._stall = StallWatch(None if plan.in_workers else plan.hang_warning, self._hangs, plan.timeout)
        self._interrupt = DeferredInterrupt(self._processes.wake_write)
        self._moments = _Moments()
        self._stop_reason: StopReason | None = None
        self._snapshot: dict = {}  # where each rank was when a hang or the timeout stopped the run
        self._stack_dump_seq: dict[int, int] = {}  # rank -> seq at which a stack dump was requested
        self._finished_ranks: set[int] = set()
        self._reported_failure: set[int] = set()  # ranks exiting on their own after reporting an exception
        self._muted = False  # a teardown after on_event failed: nothing more is passed on
        self._reading: WorkerProcess | None = None  # whose read's events are being passed on
        self._exits_due: list[WorkerProcess] = []  # reaped meanwhile: exits to pass on once that read is done

    # -- run -------------------------------------------------------------------------------------------------
    def run(self, timeout: float | None, on_started=None) -> SupervisorOutcome:
        """Start the workers, wait until every one has exited and its pipes are drained, and release everything.

        Stops everyone on the first failure, at ``timeout`` seconds, or on Ctrl-C / a kernel interrupt, which
        is raised as KeyboardInterrupt once all workers are gone (a second one kills them at once). While
        this runs, SIGINT only sets a flag, so an interrupt can never land half-way through a fork, a read or
        a reap; the previous handler is put back before the teardown. Whatever happens (an error in a start,
        in ``on_event``), nothing started here survives it: every worker is reaped, every fd closed.
        """
        interrupt = self._interrupt
        try:
            with interrupt:
                for worker in self._processes.start(self._spec_for):
                    self._demux[worker.rank] = RankDemux(worker.rank)
                if on_started is not None:
                    on_started()
                self._wait(timeout)
        finally:
            self._close()
        if interrupt.count:
            raise KeyboardInterrupt
        return SupervisorOutcome(
            stop_reason=self._stop_reason, ranks=[worker.rank for worker in self._workers],
            exit_codes={worker.rank: worker.exit_code for worker in self._workers},
            snapshot=dict(self._snapshot), stack_dump_seq=dict(self._stack_dump_seq))

    def _spec_for(self, worker: WorkerProcess, pipes: dict) -> RankSpec:
        local_rank = worker.local_rank
        return RankSpec(
            rank=worker.rank, local_rank=local_rank, world_size=self.plan.world_size,
            local_world_size=self.plan.num_processes, node_rank=self.plan.node_rank,
            device=self.plan.device, backend=self.plan.backend, env=self.plan.env_for(local_rank),
            events_fd=pipes["events"][1], stdout_fd=pipes["stdout"][1], stderr_fd=pipes["stderr"][1],
            parent_pid=os.getpid(), cpu_threads=self.plan.cpu_threads, payload_path=self.spawn_payload_path,
            store_listen_fd=self.store_listen_fd if worker.rank == 0 else -1,
            explicit_store=self.store_listen_fd >= 0, debug=self.plan.debug, results=self.plan.results,
            memory_limit=self.plan.memory_limit,
            progress_path=self._hangs.path_for(worker.rank),
            result_paths=self._result_paths(worker.rank),
        )

    def _result_paths(self, rank: int) -> list:
        """Where ``rank`` writes a large result: rank 0's, the large one unless every rank's travels
        (``results``), gets the cores to itself; under ``results="rank0"`` no other rank sends one."""
        results, ranks = self.plan.results, self.plan.num_processes
        if rank != 0 and results == "rank0":
            return []
        return self._result_files.paths_for(rank, files_for(1 if rank == 0 and results != "all" else ranks))

    def _wait(self, timeout: float | None) -> None:
        self._moments.run_ends = None if timeout is None else time.monotonic() + timeout
        while not self._finished():
            self._step()
            if self._interrupt.count and self._stop_reason != StopReason.INTERRUPTED:
                self._stop(StopReason.INTERRUPTED, grace=0.5)
                self._stop_reason = StopReason.INTERRUPTED
            if self._interrupt.count > 1:
                self._processes.signal_all(signal.SIGKILL)

    def _finished(self) -> bool:
        if self._processes.any_alive():
            return False
        if not self._processes.any_pipe_open():
            return True
        now = time.monotonic()
        if self._moments.pipes_close_at is None:
            self._moments.pipes_close_at = now + EOF_WAIT_AFTER_EXIT_S
        if now >= self._moments.pipes_close_at:  # a descendant that escaped the group still holds a pipe
            self._drain_and_close_all()
            return True
        return False

    def _step(self) -> None:
        moments = self._moments
        self._handle_ready(moments.soonest(time.monotonic(), self.plan.monitor_interval, self._stop_reason is not None))
        for worker in self._processes.without_pidfd():
            self._reap(worker)
        self.on_tick()
        self._check_progress()
        self._watch_stall()
        now = time.monotonic()
        self._processes.note_descendants(now)
        if moments.stop_at is not None and self._stop_reason is None and now >= moments.stop_at:
            self._stop(StopReason.FAILURE)
        if moments.run_ends is not None and now >= moments.run_ends and self._stop_reason is None:
            self._stop_with_diagnosis(StopReason.TIMEOUT)
        if moments.kill_at is not None and now >= moments.kill_at:
            self._processes.signal_all(signal.SIGKILL)
            moments.kill_at = None

    def _check_progress(self) -> None:
        """A hang (a rank waits in a collective that a finished rank will never join) is diagnosed and stopped
        at once, not at the timeout."""
        if self._stop_reason is not None:
            return
        done = {w.rank for w in self._workers if not w.alive} | self._finished_ranks
        if self._hangs.is_hang(done, time.monotonic()):
            self._stop_with_diagnosis(StopReason.HANG)

    def _watch_stall(self) -> None:
        """No progress for ``hang_warning`` s while a rank waits in a collective: a ``hang_notice`` with every
        rank's place and stacks (the run goes on), and another when progress resumes (``hangs.StallWatch``)."""
        if self._stop_reason is None and self._workers:
            now = time.monotonic()
            data = self._stall.check(self._states(), now, self._dump_stacks)
            if data is not None and data["state"] == "open" and self._moments.run_ends is not None:
                data["timeout_in"] = round(self._moments.run_ends - now, 1)  # (the panel counts down to it)
            if data is not None:
                self._deliver(Event(rank=-1, seq=0, time=time.monotonic(), kind=HANG_NOTICE, data=data))

    def _states(self) -> dict[int, str]:
        return {w.rank: "finished" if w.rank in self._finished_ranks else "exited" if not w.alive else "running"
                for w in self._workers}

    def _dump_stacks(self) -> None:
        """Ask every live worker for its Python stacks, and read them for STACK_DUMP_WAIT_S."""
        for worker in self._workers:
            if worker.alive:
                self._stack_dump_seq[worker.rank] = self._demux[worker.rank].seq
                self._demux[worker.rank].expect_stack_dump()
        self._processes.ask_for_stacks()
        end = time.monotonic() + STACK_DUMP_WAIT_S
        while time.monotonic() < end and self._processes.any_alive():
            self._handle_ready(max(0.0, end - time.monotonic()))

    def _stop_with_diagnosis(self, reason: StopReason) -> None:
        """Record where every rank is (collective, call site, state), collect its Python stacks, then stop."""
        self._stop_reason = reason  # first: a rank killed by the dump signal is not "the failure"
        self._snapshot = self._hangs.snapshot(self._states(), time.monotonic())
        self._dump_stacks()
        self._stop(reason)

    # -- pipes -----------------------------------------------------------------------------------------------
    def _handle_ready(self, wait_s: float) -> None:
        """One select: read every pipe that has data, reap every worker whose pidfd says it exited."""
        for worker, channel, fd in self._processes.ready(wait_s):
            if channel == EXITED:
                self._reap(worker)
            elif worker.read_fds.get(channel) == fd:  # not already drained and closed by a reap above
                self._read(worker, channel, fd)

    def _read(self, worker: WorkerProcess, channel: str, fd: int) -> bool:
        """Read what one pipe has; False when it had nothing (or reached EOF and was closed). A rank reaped while
        this read's events are passed on (one stopped the run) has its pipes drained and its exit passed on after."""
        demux = self._demux[worker.rank]
        chunk = self._processes.read(worker, channel, fd, demux.read_size(channel, PIPE_SIZE))
        if chunk is None:
            return False
        outer, self._reading = self._reading, worker
        try:
            self._deliver_all(demux.feed(channel, chunk))
        finally:
            self._reading = outer
        if outer is None:
            self._report_due_exits()
        return bool(chunk)

    def _drain(self, worker: WorkerProcess) -> None:
        """Everything a dead worker wrote is already in its pipes: read it all before reporting its exit."""
        for channel, fd in list(worker.read_fds.items()):
            while worker.read_fds.get(channel) == fd and self._read(worker, channel, fd):
                pass

    def _drain_and_close_all(self) -> None:
        self._report_due_exits()
        for worker in self._workers:
            self._drain(worker)
            for channel, fd in list(worker.read_fds.items()):  # held open by an escaped descendant
                self._deliver_all(self._demux[worker.rank].abandon(channel))
                self._processes.forget_pipe(worker, channel, fd)
        self._processes.unregister_all()

    # -- events ----------------------------------------------------------------------------------------------
    def _deliver_all(self, events) -> None:
        for event in events:  # one at a time: each may stop the run before the next is made
            self._deliver(event)

    def _with_result_files(self, event: Event) -> Event:
        """A ``result`` event with, as its attachment, the rank's in-memory files where it says the result is in them
        (``results.unpack_result`` maps them); or, where it came through the pipe because the kernel could make no
        such file, saying so (``memory_failed``: the run says it once)."""
        files, data = self._result_files, event.data
        if data.get("in_memory") and files.enabled:
            return dataclasses.replace(event, attachment=files.take(event.rank))
        if files.failed and data.get("storages") and data.get("bytes", 0) >= IN_MEMORY_FROM and \
                not data.get("memory_failed"):
            return dataclasses.replace(event, data={**data, "memory_failed": f"the kernel could not make it: "
                                                                             f"{files.failed}"})
        return event

    def _deliver(self, event: Event) -> None:
        """An event, or a run of plain lines (which can never end the run), to the stall watch and ``on_event``."""
        if self._muted:
            return
        if event.kind == RESULT:
            event = self._with_result_files(event)
        self._stall.observe(event)
        self.on_event(event)
        moments = self._moments
        if self._stop_reason is None and self._is_fatal(event):
            if event.data.get("all_ranks_raise") and not self._everyone_reported():
                deadline = time.monotonic() + PEER_REPORT_GRACE_S  # the others are raising the same error
                moments.stop_at = deadline if moments.stop_at is None else min(moments.stop_at, deadline)
            else:
                self._stop(StopReason.FAILURE)
        elif moments.stop_at is not None and self._stop_reason is None and self._everyone_reported():
            self._stop(StopReason.FAILURE)

    def _everyone_reported(self) -> bool:
        return all(w.rank in self._reported_failure or not w.alive for w in self._workers)

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
        """If it has exited: (what it left behind ended by ``RankProcesses.reap``) read all it wrote, then pass on
        its exit; while what it wrote is being passed on, its exit comes after that."""
        if not self._processes.reap(worker):
            return
        if self._reading is worker:
            self._exits_due.append(worker)
        else:
            self._report_exit(worker)

    def _report_due_exits(self) -> None:
        while self._exits_due:
            self._report_exit(self._exits_due.pop(0))

    def _report_exit(self, worker: WorkerProcess) -> None:
        self._drain(worker)
        self._deliver_all(self._demux[worker.rank].finish_python_lines())
        self._deliver(self._demux[worker.rank].event(EXIT, worker.exit_data()))

    def _reap_all(self) -> None:
        for worker in self._workers:
            self._reap(worker)

    # -- stop --------------------------------------------------------------------------------------------------
    def _stop(self, reason: StopReason, grace: float = TERMINATE_GRACE_S) -> None:
        """SIGTERM every live worker's process group now, SIGKILL after ``grace`` seconds."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._reap_all()  # one that already died on its own keeps its own cause of death
        signaled = {w.pid for w in self._workers if w.alive and w.rank not in self._reported_failure}
        for worker in self._workers:
            if worker.alive and worker.pid in signaled and not worker.exiting():  # (XLA ordinals share one)
                worker.stopped_by_launcher = True
        self._processes.signal_all(signal.SIGTERM, spare=self._reported_failure)  # SIGKILL after the grace: all
        kill_at = time.monotonic() + grace
        moments = self._moments
        moments.kill_at = kill_at if moments.kill_at is None else min(moments.kill_at, kill_at)

    def _close(self) -> None:
        """The end of every run, however it ended: nothing of ours survives, every fd is closed, every child
        reaped. What is still in the pipes is passed on; if passing it on fails (the error that ended the run,
        again), the rest is ended without it."""
        try:
            try:
                self._end_all()
            except BaseException:
                self._muted = True
                self._end_all()
                raise
        finally:
            self._processes.release()
            self._hangs.close()
            self._result_files.close()

    def _end_all(self) -> None:
        if self._processes.any_alive():
            self._processes.signal_all(signal.SIGKILL)
            deadline = time.monotonic() + CLOSE_WAIT_S
            while self._processes.any_alive() and time.monotonic() < deadline:
                self._reap_all()
                time.sleep(0.01)
        self._drain_and_close_all()
