"""notebook_launcher(): arguments → plan → start → supervise → result (or one clear error)."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from typing import Any

from . import plan as planning
from .display import TextDisplay
from .display.panel import DISPLAYS, PanelDisplay, wants_panel
from .display.state import RunState
from .events import BATCH_SIZE, EXIT, LAUNCHER, LOG, OOM_RETRY, RESULT, STREAM, Event, RunLog
from .ordering import InOrderRelease
from .rendezvous import NodeRendezvous, NodeRendezvousTimeout
from .cluster import STOP_GRACE_S, Cluster, HostFailedError, resolve_hosts
from .failure import (FailureTracker, LaunchTimeoutError, RankFailedError, RankFailure, failure_message,
                      hang_message, root_cause)
from .supervisor import Supervisor

_MAX_EVENTS_IN_MEMORY = 200_000  # output and log lines kept on the Run; every event is in the run log
_last_run: "Run | None" = None
_recent_runs: list = []
_kernel_checked = False


@dataclasses.dataclass
class Run:
    """Everything about one launch, kept after it returns or raises (see ``last_run()``).

    ``results`` and ``exit_codes`` are by global rank; ``events`` holds what every rank said (the run log in
    ``run_dir`` holds it too, without the in-memory cap).
    """

    run_id: str
    run_dir: str
    device: str
    backend: str
    start_method: str
    num_processes: int
    world_size: int
    status: str = "starting"  # starting | running | finished | failed | timed out | hung | interrupted
    results: dict = dataclasses.field(default_factory=dict)
    exit_codes: dict = dataclasses.field(default_factory=dict)
    failures: dict = dataclasses.field(default_factory=dict)
    root_cause: RankFailure | None = None
    events: list = dataclasses.field(default_factory=list)
    events_dropped: int = 0
    attempts: int = 0
    batch_sizes: dict = dataclasses.field(default_factory=dict)  # find_executable_batch_size: latest size per function
    oom_retries: list = dataclasses.field(default_factory=list)  # each restart after an out-of-memory error
    stuck_ranks: list = dataclasses.field(default_factory=list)  # a hang or timeout: the ranks that were waiting
    stacks: dict = dataclasses.field(default_factory=dict)  # a hang or timeout: each rank's Python stacks (text)
    panel_state: dict | None = None  # the run panel's final state (labextension/SCHEMA.md), when it was shown
    started_at: float = dataclasses.field(default_factory=time.time)
    duration: float = 0.0

    def result(self, rank: int = 0) -> Any:
        return self.results.get(rank)

    def output(self, rank: int | None = None, stream: str | None = None) -> list[str]:
        """The lines the workers printed (all ranks, or one), in the order received."""
        return [event.data["text"] for event in self.events
                if event.kind == "stream" and not event.data.get("redraw") and (rank is None or event.rank == rank)
                and (stream is None or event.data.get("stream") == stream)]

    def panel(self, **filters):
        """An ipywidgets inspector of this run's whole log: filter by rank, level and kind, search, page through
        it (``notebook_launcher.inspect_run`` takes the same filters, and past runs by id or directory)."""
        from .display.inspector import inspect_run

        return inspect_run(self, **filters)

    def summary(self) -> dict:
        return {
            "run_id": self.run_id, "status": self.status, "device": self.device, "backend": self.backend,
            "start_method": self.start_method, "num_processes": self.num_processes, "world_size": self.world_size,
            "attempts": self.attempts, "exit_codes": self.exit_codes, "duration_s": round(self.duration, 4),
            "root_cause": dataclasses.asdict(self.root_cause) if self.root_cause else None,
            "result_types": {rank: type(value).__name__ for rank, value in self.results.items()},
        }

    def __repr__(self) -> str:
        return (f"<Run {self.run_id} {self.status}: {self.num_processes} x {self.device}/{self.backend} "
                f"({self.start_method}), {self.duration:.2f} s, log in {self.run_dir}>")


def last_run() -> Run | None:
    """The most recent launch in this process (results by rank, exit codes, events, failures)."""
    return _last_run


def recent_runs() -> list[Run]:
    """The launches of this process, oldest first (the last 20)."""
    return list(_recent_runs)


def notebook_launcher(function, args=(), num_processes=None, mixed_precision="no", use_port="29500",
                      master_addr="127.0.0.1", node_rank=0, num_nodes=1, rdzv_backend="static", rdzv_endpoint="",
                      rdzv_conf=None, rdzv_id="none", max_restarts=0, monitor_interval=0.1,
                      log_line_prefix_template=None, *, start_method="auto", device="auto", backend="auto",
                      timeout=None, debug=None, config_file=None, memory_limit=None, display="auto", hosts=None,
                      hostfile=None, ssh_options=None, start_hosts_with="ssh", mpirun_options=None):
    """Run ``function(*args)`` on ``num_processes`` ranks from a notebook and return rank 0's return value.

    Accelerate-compatible: every keyword up to ``log_line_prefix_template`` means what it means in
    ``accelerate.notebook_launcher``. Ours are keyword-only:

    - ``start_method``: ``"auto"`` forks when safe (fast; the workers inherit the notebook's state) and spawns
      otherwise (CUDA already initialized in this kernel, or no fork on this platform), sending the function and
      args with cloudpickle; it prints one line saying which and why. ``"fork"``/``"spawn"`` force it.
    - ``device``: ``"auto"`` (CUDA GPUs if any, one rank per GPU, else CPU), ``"cpu"``, ``"cuda"``, ``"xla"``.
    - ``backend``: ``"auto"`` (nccl on CUDA, gloo on CPU) or a torch.distributed backend name.
    - ``timeout``: seconds; a run still going after it is stopped and a ``LaunchTimeoutError`` shows where every
      rank was (its collective, call site and Python stacks) and which rank diverged. With or without a
      timeout, ranks waiting in a collective 2 s after another rank finished are diagnosed the same way.
    - ``debug``: debug mode (see ``notebook_launcher.ops``): every collective first checks that the ranks agree
      on operation, shapes and dtypes and raises ``DistributedOperationException`` at once if not. None (the
      default) follows ``ACCELERATE_DEBUG_MODE``, else ``debug:`` in ``config_file`` (else
      ``ACCELERATE_CONFIG_FILE``, else Accelerate's default config file); False turns it off whatever they say.
    - ``memory_limit``: bytes (or "3GB") of address space per worker: a worker over it fails with a clear
      out-of-memory error (and ``find_executable_batch_size`` retries smaller, all ranks together).
    - ``display``: ``"auto"`` shows the live run panel in a Jupyter kernel (one output, updated while the run
      goes on: a column per rank, progress from ``report()`` or tqdm, shape-mismatch cards, out-of-memory
      retries, the root cause first; saved with the notebook) and prefixed text lines elsewhere. ``"panel"`` or
      ``"text"`` force one; ``$NOTEBOOK_LAUNCHER_DISPLAY`` sets what "auto" means.

    Each worker gets MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    ACCELERATE_MIXED_PRECISION (and ACCELERATE_USE_CPU on CPU), and an initialized default process group, so
    plain DDP code and ``accelerate.Accelerator()`` both work inside ``function``. If ``use_port`` is taken, a
    free port is used (single-node runs). Workers' stdout/stderr (Python and C++) show in this cell, each line
    prefixed with its rank (``log_line_prefix_template``, default ``"[rank ${rank}] "``) or in the panel's
    rank columns, and go to a run log on disk.

    If any rank raises, exits or is killed, every other rank is stopped (with its child processes) and a
    ``RankFailedError`` names the rank that failed first, with its traceback, then what the others were doing.
    A kernel interrupt stops every worker and raises KeyboardInterrupt. ``num_processes=1`` runs the function
    in this kernel. ``max_restarts`` relaunches all ranks after a failure up to that many times.

    Example::

        def train(lr):
            import torch.distributed as dist
            t = torch.ones(1) * lr
            dist.all_reduce(t)
            return t.item()

        notebook_launcher(train, args=(0.5,), num_processes=2)   # → 1.0

    Several hosts from one notebook: ``hosts=["node-a", "node-b"]`` (or ``hostfile=``, one host per line) starts
    ``num_processes`` ranks on each host over SSH (``ssh_options``, e.g. ``["-p", "2222", "-i", key]``; the
    same Python path must exist on every host with notebook_launcher installed), ships the function with
    cloudpickle, and brings every rank's events back into this cell, signed with a secret made for the run. A
    failure or an interrupt on any host stops every host. ``start_hosts_with="mpirun"`` starts the hosts' agents
    with the MPI found instead (``mpirun_options`` are added to its command); they connect back to this kernel.

    ``last_run()`` gives the Run afterwards: results and exit codes by rank, events, the run log directory.
    """
    global _last_run
    __tracebackhide__ = True  # IPython: the error is the story, not the launcher's frames
    if isinstance(display, str) and display not in DISPLAYS or not isinstance(display, str) and not all(
            hasattr(display, method) for method in ("show", "note", "tick", "retarget")):
        raise planning.LaunchArgumentError(
            f"display={display!r} is not one of {', '.join(map(repr, DISPLAYS))}: use \"auto\" (the live panel in "
            f"Jupyter, text elsewhere), \"panel\" or \"text\"")
    hosts = resolve_hosts(hosts, hostfile, num_nodes, node_rank, ssh_options, start_hosts_with, mpirun_options)
    if hosts:
        num_nodes, master_addr = len(hosts), hosts[0]
    plan = planning.make_plan(
        function, args, num_processes, mixed_precision, use_port, master_addr, node_rank, num_nodes,
        rdzv_backend, rdzv_endpoint, rdzv_conf, rdzv_id, max_restarts, monitor_interval, log_line_prefix_template,
        start_method, device, backend, timeout, debug, config_file, memory_limit)
    plan.in_workers = bool(hosts) or getattr(display, "in_workers", False)  # (an agent's display says so)
    payload = planning.spawn_payload(function, plan.args) if plan.spawns_workers or hosts else b""
    log = RunLog()
    run = Run(run_id=log.run_id, run_dir=log.path, device=plan.device, backend=plan.backend,
              start_method=plan.start_method, num_processes=plan.num_processes, world_size=plan.world_size)
    _last_run = run
    _recent_runs.append(run)
    del _recent_runs[:-20]
    text = TextDisplay(plan.log_line_prefix_template, plan.node_rank, plan.num_processes)
    panel = None
    if not isinstance(display, str):
        text = display  # a display of the caller's (the agent of a launch across hosts forwards the events)
    elif wants_panel(display) and not plan.runs_in_kernel and plan.device != "xla":
        ranks = range(plan.world_size) if hosts else [plan.global_rank(local) for local in range(plan.num_processes)]
        panel = PanelDisplay(RunState(run.run_id, run.run_dir, plan.device, plan.backend, plan.start_method,
                                      plan.num_processes, plan.world_size, list(ranks)),
                             plan.log_line_prefix_template)
    display = panel or text
    _warn_old_kernel_once(display)
    started = time.monotonic()
    try:
        if hosts:
            return _run_cluster(plan, run, log, display, payload, hosts, ssh_options, start_hosts_with,
                                mpirun_options)
        if plan.runs_in_kernel:
            display.note(f"1 process: running {_name(function)} in this kernel on {plan.device}")
            return _run_in_kernel(plan, run)
        if plan.device == "xla":
            display.note(plan.describe())
            return _run_xla(plan, run, log)
        return _run_workers(plan, run, log, display, payload)
    except KeyboardInterrupt:
        run.status = "interrupted"
        display.note("interrupted" if plan.runs_in_kernel else
                     f"interrupted: stopped all {plan.num_processes} worker(s)")
        raise
    except BaseException as error:
        if run.status in ("starting", "running"):
            run.status = "failed"
        if panel is not None:
            run.panel_state = panel.finish(run.status, failure=_failure_for_panel(run, error),
                                           stuck_ranks=run.stuck_ranks)
            panel = None
        raise
    finally:
        if panel is not None:  # finished, or interrupted
            interrupted = {"kind": "interrupted", "rank": None, "type": "KeyboardInterrupt", "traceback": "",
                           "message": "interrupted: every worker was stopped", "stacks": {}}
            finished = run.status == "finished"
            run.panel_state = panel.finish(run.status, result_type=type(run.result(0)).__name__ if finished else None,
                                           failure=interrupted if run.status == "interrupted" else None)
        run.duration = time.monotonic() - started
        payload_file = log.file("payload.pkl")
        if os.path.exists(payload_file):
            os.remove(payload_file)
        log.write_summary(run.summary())
        log.close()


def _run_workers(plan, run: Run, log: RunLog, display, payload: bytes):
    if plan.start_method == "fork":
        import torch.distributed  # noqa: F401 - imported once here, not in every forked worker (~1 s each)
    payload_path = ""
    if payload:
        payload_path = log.file("payload.pkl")
        descriptor = os.open(payload_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(payload)

    current = _Attempt()
    on_event = _event_handler(run, log, current)
    meeting_point = None
    if plan.num_nodes > 1 and plan.rdzv_backend == "c10d":
        meeting_point = NodeRendezvous.for_launch(f"{plan.master_addr}:{plan.requested_port}", plan.rdzv_id,
                                                  plan.num_nodes, plan.timeout, plan.rdzv_conf)
    return _attempts(plan, run, display, payload_path, on_event, current, meeting_point)


def _event_handler(run: Run, log: RunLog, current):
    """Every event of a run: kept on the Run (output lines up to a cap), written to the run log, followed by the
    attempt's FailureTracker and passed on in order (InOrderRelease) to the display."""
    def on_event(event: Event) -> None:
        if event.kind == STREAM and event.data.get("redraw"):
            pass  # a progress bar's passing state: in the run log and the panel only
        elif event.kind not in (STREAM, LOG) or len(run.events) < _MAX_EVENTS_IN_MEMORY:
            run.events.append(event)
        else:
            run.events_dropped += 1  # output lines beyond the cap are in the run log only
        log.write(event)
        current.tracker.observe(event)
        current.in_order.push(event)
        if event.kind == RESULT:
            run.results[event.rank] = _unpickle_result(event)
        elif event.kind == BATCH_SIZE:
            run.batch_sizes[event.data["key"]] = event.data["batch_size"]
        elif event.kind == EXIT:
            run.exit_codes[event.rank] = event.data.get("exit_code")
    return on_event


@dataclasses.dataclass
class _Attempt:
    """What the event handler feeds for the attempt under way."""

    tracker: FailureTracker | None = None
    in_order: InOrderRelease | None = None


def _attempts(plan, run: Run, display, payload_path: str, on_event, current: _Attempt, meeting_point):
    """Launch attempts: the first, then one per out-of-memory step down or allowed restart."""
    restarts = 0
    while True:
        run.attempts += 1
        if meeting_point is not None:  # c10d: the nodes meet; node 0 tells the others where the store is
            meeting = _meet(meeting_point, plan, run)
            plan = dataclasses.replace(plan, node_rank=meeting.node_rank, master_addr=meeting.master_addr,
                                       master_port=meeting.master_port)
            display.retarget(plan.node_rank, [plan.global_rank(local) for local in range(plan.num_processes)])
            reservation = meeting.reservation
        elif plan.num_nodes == 1:
            reservation = planning.reserve_port(plan.master_addr, plan.requested_port)
        else:
            reservation = None
        if reservation is not None and meeting_point is None:
            plan = dataclasses.replace(plan, master_port=reservation.port, port_note=reservation.note)
        if run.attempts == 1:
            display.note(plan.describe())
        tracker = current.tracker = FailureTracker()
        in_order = current.in_order = InOrderRelease([plan.global_rank(local) for local in range(plan.num_processes)],
                                                     display.show)
        supervisor = Supervisor(plan, on_event, payload_path, on_tick=_both(in_order.release, display.tick),
                                store_listen_fd=reservation.fileno() if reservation else -1, progress_dir=run.run_dir)
        run.status = "running"
        try:  # once started, rank 0 has its own copy of the listening socket
            supervisor.run(plan.timeout, on_started=reservation.close if reservation else None)
        finally:
            if reservation is not None:
                reservation.close()
            supervisor.close()
            in_order.release(everything=True)
        ranks = [worker.rank for worker in supervisor.workers]
        if supervisor.stop_reason in ("hang", "timeout"):
            run.status = "hung" if supervisor.stop_reason == "hang" else "timed out"
            message = hang_message(supervisor.snapshot, tracker, supervisor.stack_dump_seq, plan.timeout,
                                   run.run_dir, supervisor.stop_reason == "timeout")
            run.stuck_ranks = sorted(rank for rank, info in supervisor.snapshot.items()
                                     if info.get("state") == "running")
            run.stacks = {rank: "\n".join(tracker.stderr_since(rank, seq))
                          for rank, seq in supervisor.stack_dump_seq.items()}
            if all(tracker.state(rank) == "starting" for rank in ranks):
                message = _rendezvous_note(plan) + "\n\n" + message
            raise LaunchTimeoutError(message, run)
        failures = tracker.failures()
        if not failures and supervisor.stop_reason is None:
            return _finished(run, display)
        run.failures, run.root_cause = failures, root_cause(failures)
        # on an agent of a launch across hosts, the launching kernel decides new tries for every host
        again = None if getattr(display, "single_attempt", False) else _try_again(
            plan, run, failures, restarts, on_event, "all ranks")
        if again is None:
            run.status = "failed"
            raise RankFailedError(failure_message(run.root_cause, failures, tracker, ranks, run.run_dir),
                                  run.root_cause, failures, run)
        plan, restarts = again


def _run_cluster(plan, run: Run, log: RunLog, display, payload: bytes, hosts: list[str], ssh_options,
                 start_hosts_with: str = "ssh", mpirun_options=None):
    """Every host's ranks through its SSH-started agent; their events join this kernel's event pipeline. An
    out-of-memory step down (find_executable_batch_size) or a restart (max_restarts) starts every host again."""
    current = _Attempt()
    on_event = _event_handler(run, log, current)
    display.note(f"{plan.world_size} processes on {len(hosts)} hosts ({', '.join(hosts)}), {plan.num_processes} "
                 f"per host, on {plan.device} ({plan.backend})")
    restarts = 0
    while True:
        run.attempts += 1
        current.tracker = FailureTracker()
        current.in_order = InOrderRelease(list(range(plan.world_size)), display.show)
        cluster = Cluster(plan, hosts, ssh_options, payload, on_event, display.note,
                          on_tick=_both(current.in_order.release, display.tick), start_with=start_hosts_with,
                          mpirun_options=mpirun_options)
        run.status = "running"
        try:
            cluster.run(plan.timeout)
        finally:
            current.in_order.release(everything=True)
        if cluster.stop_reason == "interrupted":
            raise KeyboardInterrupt
        failures = current.tracker.failures()
        problem = cluster.host_problem()
        if failures:
            run.failures, run.root_cause = failures, root_cause(failures)
            again = None if problem else _try_again(plan, run, failures, restarts, on_event, "every host")
            if again is not None:
                plan, restarts = again
                continue
            cause = run.root_cause
            run.status = "failed"
            message = failure_message(cause, failures, current.tracker, list(range(plan.world_size)), run.run_dir)
            where = "; ".join(f"{host}: ranks {node * plan.num_processes}-{(node + 1) * plan.num_processes - 1}"
                              for node, host in enumerate(hosts))
            message += f"\n\nRank {cause.rank} ran on {hosts[cause.rank // plan.num_processes]} ({where})."
            raise RankFailedError(message + (f"\n\n{problem}" if problem else ""), cause, failures, run)
        if problem:
            run.status = "failed"
            raise HostFailedError(problem, run)
        if cluster.stop_reason == "timeout":
            run.status = "timed out"
            raise LaunchTimeoutError(f"the hosts did not finish within timeout={plan.timeout:g} s (plus "
                                     f"{STOP_GRACE_S:g} s for their own diagnosis); every host was stopped", run)
        reported = cluster.node_error()
        if reported:
            node, error = reported
            run.status = "timed out" if error.get("type") == "LaunchTimeoutError" else "failed"
            text = f"host {node.host} (node {node.node_rank}): {error.get('message')}"
            if error.get("type") == "LaunchTimeoutError":
                raise LaunchTimeoutError(text, run)
            raise HostFailedError(f"{text}\n{error.get('traceback', '')}", run)
        return _finished(run, display)


def _meet(meeting_point: NodeRendezvous, plan, run: Run):
    try:
        return meeting_point.meet()
    except NodeRendezvousTimeout as exc:
        meeting_point.forget()
        run.status = "timed out"
        raise LaunchTimeoutError(
            f"This node waited at the c10d rendezvous {meeting_point.endpoint} (rdzv_id={plan.rdzv_id!r}) for "
            f"all {plan.num_nodes} nodes and not all arrived within {meeting_point.join_timeout:g} s: a node never "
            f"joined. Start the same launch on every node with the same num_nodes, rdzv_endpoint and rdzv_id, "
            f"and check that {meeting_point.endpoint} is reachable from every node. (torch: {exc})", run) from None


def _both(first, second):
    def both():
        first()
        second()
    return both


def _failure_for_panel(run: Run, error: BaseException) -> dict:
    """What the panel shows first when a run ends badly: the root cause's traceback, then the whole story."""
    cause = run.root_cause
    kind = {"hung": "hang", "timed out": "timeout"}.get(run.status, "failure")
    return {"kind": kind, "rank": cause.rank if cause and kind == "failure" else None,
            "type": cause.type if cause and kind == "failure" else type(error).__name__,
            "traceback": cause.traceback if cause and kind == "failure" else "",
            "message": str(error), "stacks": {str(rank): text for rank, text in run.stacks.items()}}


def _rendezvous_note(plan) -> str:
    """No rank got past joining the process group: on several nodes, a node that never arrived."""
    where = f"{plan.master_addr}:{plan.master_port}"
    if plan.num_nodes > 1:
        return (f"The ranks of node {plan.node_rank} waited at the rendezvous ({where}) for all {plan.world_size} "
                f"ranks and not all arrived within timeout={plan.timeout:g} s: a node never joined. Start the "
                f"same launch on every node, each with its own node_rank (0..{plan.num_nodes - 1}), the same "
                f"num_nodes, master_addr and use_port, and check that {where} is reachable from every node.")
    return (f"No rank finished joining the process group ({where}) within timeout={plan.timeout:g} s; see where "
            f"each one was below.")


def _warn_old_kernel_once(display: TextDisplay) -> None:
    global _kernel_checked
    if _kernel_checked or not sys.platform.startswith("linux"):
        return
    _kernel_checked = True
    from .doctor import WARNING, check_kernel_release

    check = check_kernel_release(platform.release())
    if check.verdict == WARNING:
        display.note(f"warning: Linux kernel {check.found} ({check.fix})")


def _finished(run: Run, display):
    run.status = "finished"
    run.failures, run.root_cause = {}, None  # an earlier try's out-of-memory error is in run.oom_retries
    if run.oom_retries:
        display.note(f"finished at batch size {run.batch_sizes[run.oom_retries[-1]['key']]}")
    return run.result(0)


def _try_again(plan, run: Run, failures: dict, restarts: int, on_event, who: str):
    """After a failed try (``run.root_cause`` set): (plan, restarts) for the next one, or None. An out-of-memory
    error in find_executable_batch_size starts everyone again at the agreed smaller size; another failure does
    while max_restarts allows."""
    cause = run.root_cause
    if cause.oom_retry:
        retry = _agreed_retry(failures)
        run.oom_retries.append(retry)
        on_event(Event(rank=cause.rank, seq=0, time=time.monotonic(), kind=OOM_RETRY, data=retry))
        sizes = {**(plan.batch_sizes or {}), retry["key"]: retry["new_batch_size"]}
        return dataclasses.replace(plan, batch_sizes=sizes), restarts
    if restarts >= plan.max_restarts:
        return None
    on_event(Event(rank=cause.rank, seq=0, time=time.monotonic(), kind=LAUNCHER, data={
        "text": f"rank {cause.rank} failed ({cause.headline.splitlines()[0][:200]}); restarting {who} "
                f"({restarts + 1} of max_restarts={plan.max_restarts})"}))
    return plan, restarts + 1


def _agreed_retry(failures: dict) -> dict:
    """One retry for all ranks that ran out of memory at this try: the smallest size any of them proposes."""
    reports = {rank: failure.oom_retry for rank, failure in failures.items() if failure.oom_retry}
    first = min(reports.items(), key=lambda item: item[1]["new_batch_size"])[1]
    return {**first, "ranks": sorted(reports), "new_batch_size": min(r["new_batch_size"] for r in reports.values())}


def _unpickle_result(event: Event):
    import cloudpickle

    try:
        return cloudpickle.loads(event.attachment)
    except Exception as exc:  # noqa: BLE001 - keep supervising; say what could not come back
        return ResultUnavailable(f"rank {event.rank}'s return value (a {event.data.get('type')}) could not be "
                                 f"unpickled in the kernel: {type(exc).__name__}: {exc}")


class ResultUnavailable(str):
    """Stands in for a rank's return value that the kernel could not unpickle; the text says why."""


def _run_in_kernel(plan, run: Run):
    """One rank in the kernel itself: a one-process default group (so DDP code runs unchanged) and the
    Accelerate variables, both put back as they were afterwards."""
    import torch.distributed as dist

    env = {"ACCELERATE_MIXED_PRECISION": plan.mixed_precision, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_WORLD_SIZE": "1"}
    if plan.device == "cpu":
        env["ACCELERATE_USE_CPU"] = "true"
    saved = {key: os.environ.get(key) for key in env}
    own_group = dist.is_available() and not dist.is_initialized() and plan.device in ("cpu", "cuda")
    run.status = "running"
    os.environ.update(env)
    try:
        if own_group:
            dist.init_process_group(plan.backend, store=dist.HashStore(), rank=0, world_size=1)
        result = plan.function(*plan.args)
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    run.results[0] = result
    run.status = "finished"
    return result


def _run_xla(plan, run: Run, log: RunLog):
    import cloudpickle

    from .worker import XlaEntry

    xmp = planning.import_xla_multiprocessing()
    result_path = log.file("xla_result.pkl")
    run.status = "running"
    xmp.spawn(XlaEntry(plan.function, result_path), args=plan.args, nprocs=plan.num_processes,
              start_method=plan.start_method)
    if os.path.exists(result_path):
        with open(result_path, "rb") as saved:
            run.results[0] = cloudpickle.load(saved)
        os.remove(result_path)
    run.status = "finished"
    return run.result(0)


def _name(function) -> str:
    return getattr(function, "__qualname__", type(function).__name__)
