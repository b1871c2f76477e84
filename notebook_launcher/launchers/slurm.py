"""Ranks on the nodes of a Slurm job (``start_hosts_with="srun"``): the job this kernel runs in, or one asked for
with ``slurm_options`` (``cluster/allocation.py``); then one agent per node as a step of it
(``cluster/starts.SrunStart``), which ``HostsLauncher`` runs like any launch across hosts (events, root cause,
teardown, new attempts). At the end no step of ours is left in the job, and an allocation asked for is given
back, whatever happened. A step that starts no rank for a while (srun waits, silently, while Slurm cannot create
it) is said once, and a timeout names it."""

from __future__ import annotations

import dataclasses
import time

from ..cluster.allocation import Allocation
from ..cluster.slurm_job import (
    SlurmError,
    SlurmJob,
    allocation_options,
    cancel_steps,
    check_fits,
    job_from_env,
    job_state,
)
from ..cluster.starts import SrunStart
from ..display import Display
from ..errors import HostFailedError, LaunchTimeoutError
from ..plan import LaunchPlan
from ..schema.status import RunStatus, StopReason
from .base import Launcher
from .hosts import HostSettings, HostsLauncher
from .intake import EventIntake
from .outcome import LaunchOutcome
from .restarts import RestartPolicy

STEP_NOTICE_S = 60.0  # a step that has started no rank in this long is said (srun may wait without a word)


class SlurmLauncher(Launcher):
    def __init__(self, settings: HostSettings, payload: bytes):
        self.settings = settings
        self.payload = payload

    def launch(self, plan: LaunchPlan, display: Display, intake: EventIntake,
               policy: RestartPolicy) -> LaunchOutcome:
        __tracebackhide__ = True
        allocation = job = None
        try:
            if self.settings.slurm_options is not None:
                asked = list(self.settings.slurm_options)
                allocation = Allocation(allocation_options(asked, plan.num_processes, plan.device), display.note,
                                        display.tick, asked)
                job = allocation.wait(plan.timeout)
                if allocation.ended == "interrupted":
                    raise KeyboardInterrupt
                if allocation.ended == "timeout":
                    which = (f"job {allocation.job_id}, {allocation.reason or 'pending'}" if allocation.job_id else
                             "salloc had not said its job id yet")
                    return LaunchOutcome.stopped(StopReason.TIMEOUT, LaunchTimeoutError(
                        f"Slurm did not grant the allocation within timeout={plan.timeout:g} s ({which}); it was "
                        f"cancelled"))
                hosts = job.hosts
                if len(hosts) != plan.num_nodes:
                    return LaunchOutcome(RunStatus.FAILED, error=HostFailedError(
                        f"Slurm job {job.job_id} has {len(hosts)} node(s) ({', '.join(hosts)}), not the "
                        f"{plan.num_nodes} slurm_options asked for; it was given back"))
            else:
                job, hosts = job_from_env(), self.settings.hosts
            try:
                warning = check_fits(job, hosts, plan.num_processes, plan.device)
                start = SrunStart(job, hosts, plan.device)
            except SlurmError as exc:
                return LaunchOutcome(RunStatus.FAILED, error=HostFailedError(f"Slurm job {job.job_id}: {exc}"))
            if warning:
                display.note(warning)
            settings = dataclasses.replace(self.settings, hosts=hosts, start=start)
            watch = StepWatch(intake, job, hosts, plan, display.note)
            outcome = HostsLauncher(settings, self.payload).launch(plan, display, watch, policy)
            if isinstance(outcome.error, LaunchTimeoutError):
                return dataclasses.replace(outcome, error=LaunchTimeoutError(watch.explain(str(outcome.error))))
            return outcome
        finally:
            if allocation is not None:
                allocation.release()  # its steps end with it
            elif job is not None:
                left = cancel_steps(job.job_id)
                if left:
                    display.note(f"cancelled step(s) left in Slurm job {job.job_id}: {', '.join(left)}")


class StepWatch:
    """An attempt's events as HostsLauncher takes them, watched for the nodes whose ranks have not started: srun
    waits without a word while Slurm cannot create its step (a suspended job, busy or unresponsive nodes)."""

    def __init__(self, intake: EventIntake, job: SlurmJob, hosts: list[str], plan: LaunchPlan, note):
        self._intake, self.job, self.hosts, self.plan, self.note = intake, job, hosts, plan, note
        self._started = time.monotonic()
        self._heard: set[int] = set()
        self._said = False

    def __getattr__(self, name: str):
        return getattr(self._intake, name)

    def begin(self, ranks) -> None:
        self._intake.begin(ranks)
        self._started, self._heard, self._said = time.monotonic(), set(), False

    def on_event(self, event) -> None:
        self._heard.add(event.rank)
        self._intake.on_event(event)

    def tick(self) -> None:
        self._intake.tick()
        if not self._said and time.monotonic() - self._started > STEP_NOTICE_S and self.silent():
            self._said = True
            bound = "" if self.plan.timeout is not None else " (timeout= bounds the wait)"
            state = job_state(self.job.job_id)
            self.note(f"Slurm job {self.job.job_id}: no rank has started on {', '.join(self.silent())} after "
                      f"{STEP_NOTICE_S:g} s{f' (the job is {state})' if state else ''}. srun waits while Slurm "
                      f"cannot start its step (a suspended job, busy or unresponsive nodes): `squeue -s "
                      f"--jobs={self.job.job_id}` lists the steps, `scontrol show job {self.job.job_id}` says why; "
                      f"an interrupt stops the launch{bound}")

    def silent(self) -> list[str]:
        """The nodes none of whose ranks has been heard from in this attempt."""
        heard = {rank // self.plan.num_processes for rank in self._heard}
        return [host for node, host in enumerate(self.hosts) if node not in heard]

    def explain(self, message: str) -> str:
        """A timeout's message, with the job and its step: which nodes never started a rank, and why to look."""
        silent = self.silent()
        if not silent:
            return f"Slurm job {self.job.job_id}, the step on {', '.join(self.hosts)}: {message}"
        state = job_state(self.job.job_id)
        return (f"Slurm job {self.job.job_id}: its srun step never started a rank on {', '.join(silent)} ("
                f"{f'the job is {state}; ' if state else ''}`scontrol show job {self.job.job_id}` says why). "
                f"{message[:1].upper()}{message[1:]}")
