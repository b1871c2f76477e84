"""Ranks on the nodes of a Slurm job (``start_hosts_with="srun"``): the job this kernel runs in, or one asked for
with ``slurm_options`` (``cluster/allocation.py``); then one agent per node as a step of it
(``cluster/slurm.SrunStart``), which ``HostsLauncher`` runs like any launch across hosts (events, root cause,
teardown, new attempts). At the end no step of ours is left in the job, and an allocation asked for is given
back, whatever happened."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..cluster.allocation import Allocation
from ..cluster.slurm import SlurmError, SrunStart, allocation_options, cancel_steps, check_fits, job_from_env
from ..errors import HostFailedError, LaunchArgumentError, LaunchTimeoutError
from ..runs import Run
from ..schema.status import RunStatus
from .attempts import RestartPolicy
from .hosts import HostSettings, HostsLauncher
from .intake import AttemptEvents


class SlurmLauncher:
    def __init__(self, settings: HostSettings, payload: bytes):
        self.settings = settings
        self.payload = payload

    def launch(self, plan, run: Run, display, events: AttemptEvents, policy: RestartPolicy) -> Any:
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
                    run.status = RunStatus.TIMED_OUT
                    raise LaunchTimeoutError(f"Slurm did not grant the allocation within timeout={plan.timeout:g} s "
                                             f"(job {allocation.job_id}, {allocation.reason or 'pending'}); it was "
                                             f"cancelled", run)
                hosts = job.hosts
                if len(hosts) != plan.num_nodes:
                    raise HostFailedError(f"Slurm job {job.job_id} has {len(hosts)} node(s) ({', '.join(hosts)}), "
                                          f"not the {plan.num_nodes} slurm_options asked for; it was given back", run)
            else:
                job, hosts = job_from_env(), self.settings.hosts
            try:
                check_fits(job, hosts, plan.num_processes, plan.device)
                start = SrunStart(job, hosts, plan.device)
            except SlurmError as exc:
                raise HostFailedError(f"Slurm job {job.job_id}: {exc}", run) from None
            settings = dataclasses.replace(self.settings, hosts=hosts, srun=start)
            return HostsLauncher(settings, self.payload).launch(plan, run, display, events, policy)
        except LaunchArgumentError:
            run.status = RunStatus.FAILED
            raise
        finally:
            if allocation is not None:
                allocation.release()  # its steps end with it
            elif job is not None:
                left = cancel_steps(job.job_id)
                if left:
                    display.note(f"cancelled step(s) left in Slurm job {job.job_id}: {', '.join(left)}")
