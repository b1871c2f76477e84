"""Ranks on several hosts from one notebook (``hosts=`` or ``hostfile=``): an agent per host, started over SSH
or by mpirun (``cluster/starts.py``, chosen here by ``agent_start``) and run by ``cluster.coordinator.Cluster``, whose
signed events join this kernel's pipeline like local ranks' events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..cluster.coordinator import STOP_GRACE_S, Cluster
from ..cluster.starts import AgentStart, MpirunStart, SshStart
from ..display import Display
from ..errors import HostFailedError, LaunchTimeoutError, RankFailedError
from ..plan import LaunchPlan
from ..schema.status import RunStatus, StopReason
from ..supervision.failure import failure_message, root_cause
from .base import Launcher
from .intake import EventIntake
from .outcome import LaunchOutcome
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
    """``launch()`` starts every host's agent for each attempt and returns how the last one ended; an
    out-of-memory step down or a restart (max_restarts) starts every host again; the first failure anywhere stops
    every host."""

    def __init__(self, settings: HostSettings, payload: bytes):
        self.settings = settings
        self.payload = payload  # (function, args), pickled for the agents

    def launch(self, plan: LaunchPlan, display: Display, intake: EventIntake,
               policy: RestartPolicy) -> LaunchOutcome:
        __tracebackhide__ = True  # IPython shows the error, not the launcher's frames (the run log has them)
        hosts, start = self.settings.hosts, agent_start(self.settings)
        display.note(f"{plan.world_size} processes on {len(hosts)} hosts ({', '.join(hosts)}), {plan.num_processes} "
                     f"per host, on {plan.device} ({plan.backend})")
        while True:
            intake.begin(range(plan.world_size))
            cluster = Cluster(plan, hosts, start, self.payload, intake.on_event, display.note, on_tick=intake.tick)
            try:
                cluster.run(plan.timeout)
            finally:
                intake.end()
            if cluster.stop_reason == StopReason.INTERRUPTED:
                raise KeyboardInterrupt
            failures = intake.tracker.failures()
            problem = cluster.host_problem()
            if failures:
                again = policy.next_plan(plan, failures, "every host", may_retry=not problem)
                if again is not None:
                    plan = again
                    continue
                return LaunchOutcome.stopped(StopReason.FAILURE, self._rank_failed(plan, intake, failures, problem),
                                             failures=failures)
            if problem:
                return LaunchOutcome(RunStatus.FAILED, cluster.stop_reason, error=HostFailedError(problem))
            if cluster.stop_reason == StopReason.TIMEOUT:
                return LaunchOutcome.stopped(StopReason.TIMEOUT, LaunchTimeoutError(
                    f"the hosts did not finish within timeout={plan.timeout:g} s (plus {STOP_GRACE_S:g} s for "
                    f"their own diagnosis); every host was stopped"))
            reported = cluster.node_error()
            if reported:
                node, error = reported
                text = f"host {node.host} (node {node.node_rank}): {error.get('message')}"
                if error.get("type") == "LaunchTimeoutError":  # (a node's own timeout, by its error's name)
                    return LaunchOutcome.stopped(StopReason.TIMEOUT, LaunchTimeoutError(text))
                return LaunchOutcome(RunStatus.FAILED, cluster.stop_reason,
                                     error=HostFailedError(f"{text}\n{error.get('traceback', '')}"))
            return intake.finished()

    def _rank_failed(self, plan: LaunchPlan, intake: EventIntake, failures: dict, problem) -> RankFailedError:
        """The root cause first, then which host each rank ran on (and why a host could not run, if one could not)."""
        hosts, cause = self.settings.hosts, root_cause(failures)
        message = failure_message(cause, failures, intake.tracker, list(range(plan.world_size)), intake.run_dir)
        where = "; ".join(f"{host}: ranks {node * plan.num_processes}-{(node + 1) * plan.num_processes - 1}"
                          for node, host in enumerate(hosts))
        message += f"\n\nRank {cause.rank} ran on {hosts[cause.rank // plan.num_processes]} ({where})."
        return RankFailedError(message + (f"\n\n{problem}" if problem else ""), cause, failures)
