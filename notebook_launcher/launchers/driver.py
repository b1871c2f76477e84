"""One launch from a checked plan: the run's record and log, the display, the launcher that fits the plan, and
the end of the story whatever happens (status, the panel's last state, the summary on disk). The launcher returns
how the launch ended (``LaunchOutcome``); this module alone writes it, and the run's status, into the Run.

``notebook_launcher()`` calls ``launch`` after checking its arguments; an agent of a launch across hosts calls it
with a display of its own (which forwards every event) and ``single_attempt=True``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

from ..display import Display, TextDisplay
from ..display.panel import PanelDisplay, wants_panel
from ..display.state import RunState
from ..plan import LaunchPlan
from ..runs import Run, remember
from ..schema.runlog import RunLog
from ..schema.status import RunStatus, StopReason, stopped_by
from .base import Launcher
from .hosts import HostSettings, HostsLauncher
from .in_kernel import InKernelLauncher
from .intake import EventIntake
from .local import LocalLauncher
from .outcome import LaunchOutcome
from .payload import spawn_payload
from .restarts import RestartPolicy

_kernel_checked = False


def launch(plan: LaunchPlan, display: str | Display = "auto", hosts: HostSettings | None = None,
           single_attempt: bool = False, log: RunLog | None = None) -> Any:
    """Run the plan; return rank 0's result or raise the one error that tells what happened. ``log``: the run's
    log, where its folder was made already (a detached run's supervisor)."""
    __tracebackhide__ = True
    launcher = choose_launcher(plan, hosts)
    log = log or RunLog()
    run = Run(run_id=log.run_id, run_dir=log.path, device=plan.device, backend=plan.backend,
              start_method=plan.start_method, num_processes=plan.num_processes, world_size=plan.world_size)
    remember(run)
    panel = None
    if not isinstance(display, str):
        shown = display
    elif wants_panel(display) and not plan.runs_in_kernel:
        ranks = range(plan.world_size) if hosts else [plan.global_rank(local) for local in range(plan.num_processes)]
        shown = panel = PanelDisplay(RunState(run.run_id, run.run_dir, plan.device, plan.backend, plan.start_method,
                                              plan.num_processes, plan.world_size, list(ranks)),
                                     plan.log_line_prefix_template)
    else:
        shown = TextDisplay(plan.log_line_prefix_template, plan.node_rank, plan.num_processes)
    _warn_old_kernel_once(shown)
    log.report_to(shown.note)  # a full or failing disk: one warning, and the run goes on
    started, closed = time.monotonic(), False

    def running() -> None:  # an attempt began
        run.status = RunStatus.RUNNING

    intake = EventIntake(run, log, shown, single_attempt, started=running)
    try:
        outcome = launcher.launch(plan, shown, intake, RestartPolicy(intake.on_event, single_attempt))
        _record(run, outcome)
        if outcome.error is not None:
            raise outcome.error
        return outcome.result
    except KeyboardInterrupt:
        run.status = RunStatus.INTERRUPTED
        shown.note("interrupted" if plan.runs_in_kernel else
                   f"interrupted: stopped all {plan.num_processes} worker(s)")
        raise
    except BaseException as error:
        intake.note_left_out()
        if run.status in (RunStatus.STARTING, RunStatus.RUNNING):
            run.status = RunStatus.FAILED
        if panel is not None:
            _close(run, log, shown, started)  # first: what it says belongs in the panel's last state
            closed = True
            run.panel_state = panel.finish(run.status, failure=_failure_for_panel(run, error),
                                           stuck_ranks=run.stuck_ranks)
            panel = None
        raise
    finally:
        intake.note_left_out()  # (once: before the panel's last state, whatever happened)
        if not closed:
            _close(run, log, shown, started)
        if panel is not None:  # finished, or interrupted
            interrupted = {"kind": StopReason.INTERRUPTED.value, "rank": None, "type": "KeyboardInterrupt",
                           "traceback": "", "message": "interrupted: every worker was stopped", "stacks": {}}
            finished = run.status == RunStatus.FINISHED
            run.panel_state = panel.finish(run.status, result_type=type(run.result(0)).__name__ if finished else None,
                                           failure=interrupted if run.status == RunStatus.INTERRUPTED else None)


def choose_launcher(plan: LaunchPlan, hosts: HostSettings | None) -> Launcher:
    """The mechanism for this plan. (A new one goes here: a class that declares ``base.Launcher``.)"""
    if hosts is not None:
        if hosts.start_with == "srun":
            from .slurm import SlurmLauncher

            return SlurmLauncher(hosts, spawn_payload(plan.function, plan.args))
        return HostsLauncher(hosts, spawn_payload(plan.function, plan.args))
    if plan.runs_in_kernel:
        return InKernelLauncher()
    return LocalLauncher(spawn_payload(plan.function, plan.args) if plan.spawns_workers else b"")


def _record(run: Run, outcome: LaunchOutcome) -> None:
    """How the launch ended, into its Run (and the Run into the error the launch raises)."""
    run.status = outcome.status
    run.failures, run.root_cause = outcome.failures, outcome.root_cause
    run.stuck_ranks, run.stacks = outcome.stuck_ranks, outcome.stacks
    if outcome.error is not None:
        outcome.error.run = run


def _close(run: Run, log: RunLog, display, started: float) -> None:
    """The run's summary on disk, once (before the panel's last state, which shows any warning it gives). The run
    log is the record, not the result: a folder removed under us, a full disk, must not hide the outcome."""
    run.duration = time.monotonic() - started
    try:
        payload_file = log.file("payload.pkl")
        if os.path.exists(payload_file):
            os.remove(payload_file)  # (first: it frees the space the summary may need)
    except OSError as exc:
        display.note(f"warning: could not remove the run's payload in {run.run_dir} ({exc})")
    log.close()
    log.write_summary(run.summary())


def _failure_for_panel(run: Run, error: BaseException) -> dict:
    """What the panel shows first when a run ends badly: the root cause's traceback, then the whole story."""
    cause = run.root_cause
    kind = (stopped_by(run.status) or StopReason.FAILURE).value
    return {"kind": kind, "rank": cause.rank if cause and kind == "failure" else None,
            "type": cause.type if cause and kind == "failure" else type(error).__name__,
            "traceback": cause.traceback if cause and kind == "failure" else "",
            "message": str(error), "stacks": {str(rank): text for rank, text in run.stacks.items()}}


def _warn_old_kernel_once(display) -> None:
    global _kernel_checked
    if _kernel_checked or not sys.platform.startswith("linux"):
        return
    _kernel_checked = True
    from ..doctor import WARNING, check_kernel_release

    check = check_kernel_release(platform.release())
    if check.verdict == WARNING:
        display.note(f"warning: Linux kernel {check.found} ({check.fix})")
