"""Ranks on several hosts from one notebook (``hosts=`` or ``hostfile=``): an agent per host, started over SSH
or by mpirun (``cluster/starts.py``, chosen here by ``agent_start``) and run by ``cluster.coordinator.Cluster``, whose
signed events join this kernel's pipeline like local ranks' events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cluster.coordinator import STOP_GRACE_S, Cluster
from ..cluster.starts import AgentStart, MpirunStart, SshStart
from ..display import Display
from ..errors import HostFailedError, LaunchTimeoutError, RankFailedError
from ..plan import LaunchPlan
from ..runs import Run
from ..schema.status import RunStatus, StopReason
from ..supervision.failure import failure_message
from .base import Launcher
from .intake import AttemptEvents
from .restarts import RestartPolicy


@dataclass
class HostSettings:
    """Where and how the hosts' agents start (checked by ``remote.resolve_hosts``)."""

    hosts: list
    ssh_options: list | None = None
    start_with: str = "ssh"  # "ssh" | "mpirun" | "srun"
    mpirun_options: list | None = None
    slurm_options: list | None = None  # srun from outside a job: salloc's options (launchers/slurm.py)
    start: AgentStart | None = None  # how the agents start, where it is made elsewhere (SlurmLauncher's SrunStart)


AGENT_STARTS: dict[str, Callable[[HostSettings], AgentStart]] = {  # start_hosts_with → how the agents start
    "ssh": lambda settings: SshStart(settings.ssh_options),
    "mpirun": lambda settings: MpirunStart(settings.mpirun_options),
}  # (srun: SlurmLauncher makes cluster.starts.SrunStart once it has the job's nodes)


def agent_start(settings: HostSettings) -> AgentStart:
    """How the hosts' agents start: the one made for these settings, else the one ``start_with`` names."""
    return settings.start or AGENT_STARTS[settings.start_with](settings)


class HostsLauncher(Launcher):
    """``launch()`` starts every host's agent for each attempt; an out-of-memory step down or a restart
    (max_restarts) starts every host again; the first failure anywhere stops every host."""

    def __init__(self, settings: HostSettings, payload: bytes):
        self.settings = settings
        self.payload = payload  # (function, args), pickled for the agents

    def launch(self, plan: LaunchPlan, run: Run, display: Display, events: AttemptEvents,
               policy: RestartPolicy) -> Any:
        __tracebackhide__ = True  # IPython shows the error, not the launcher's frames (the run log has them)
        hosts, start = self.settings.hosts, agent_start(self.settings)
        display.note(f"{plan.world_size} processes on {len(hosts)} hosts ({', '.join(hosts)}), {plan.num_processes} "
                     f"per host, on {plan.device} ({plan.backend})")
        while True:
            events.begin(range(plan.world_size))
            cluster = Cluster(plan, hosts, start, self.payload, events.on_event, display.note, on_tick=events.tick)
            try:
                cluster.run(plan.timeout)
            finally:
                events.end()
            if cluster.stop_reason == StopReason.INTERRUPTED:
                raise KeyboardInterrupt
            failures = events.tracker.failures()
            problem = cluster.host_problem()
            if failures:
                again = policy.next_plan(plan, failures, "every host", may_retry=not problem)
                if again is not None:
                    plan = again
                    continue
                raise self._rank_failed(plan, run, events, failures, problem)
            if problem:
                run.status = RunStatus.FAILED
                raise HostFailedError(problem, run)
            if cluster.stop_reason == StopReason.TIMEOUT:
                run.status = RunStatus.TIMED_OUT
                raise LaunchTimeoutError(f"the hosts did not finish within timeout={plan.timeout:g} s (plus "
                                         f"{STOP_GRACE_S:g} s for their own diagnosis); every host was stopped", run)
            reported = cluster.node_error()
            if reported:
                node, error = reported
                run.status = RunStatus.TIMED_OUT if error.get("type") == "LaunchTimeoutError" else RunStatus.FAILED
                text = f"host {node.host} (node {node.node_rank}): {error.get('message')}"
                if error.get("type") == "LaunchTimeoutError":
                    raise LaunchTimeoutError(text, run)
                raise HostFailedError(f"{text}\n{error.get('traceback', '')}", run)
            return events.finished()

    def _rank_failed(self, plan: LaunchPlan, run: Run, events: AttemptEvents, failures: dict,
                     problem) -> RankFailedError:
        """The root cause first, then which host each rank ran on (and why a host could not run, if one could not)."""
        hosts, cause = self.settings.hosts, run.root_cause
        run.status = RunStatus.FAILED
        message = failure_message(cause, failures, events.tracker, list(range(plan.world_size)), run.run_dir)
        where = "; ".join(f"{host}: ranks {node * plan.num_processes}-{(node + 1) * plan.num_processes - 1}"
                          for node, host in enumerate(hosts))
        message += f"\n\nRank {cause.rank} ran on {hosts[cause.rank // plan.num_processes]} ({where})."
        return RankFailedError(message + (f"\n\n{problem}" if problem else ""), cause, failures, run)
