"""How the agents of a launch across hosts start (``start_hosts_with``): one small class per way, behind
``AgentStart``; ``coordinator.Cluster`` runs whichever it is given and keeps what every way shares (the agents'
settings, their signed events, the stop, the teardown).

Two shapes: over its own pipes (ssh: one process per host whose stdin/stdout are that agent's channel, the run's
secret sent on stdin), or connecting back (mpirun, srun: one process starts every host's agent, each of which
connects back to the kernel, ``backchannel.py``, with the secret from that process's environment). A new way to
start agents is one class here and one line where it is chosen (``launchers/hosts.py``'s ``AGENT_STARTS``; srun's
is made by ``launchers/slurm.SlurmLauncher`` once it has the job's nodes).
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass
from typing import Protocol

from ..errors import HostFailedError
from .remote import SSH_FIX, check_ssh, mpirun_command, mpirun_problem, ssh_command
from .slurm_job import ARG_MAX, STEP_NAME, SlurmError, SlurmJob, gpus_per_node, node_addresses, slurm_env


@dataclass(frozen=True)
class AgentEnd:
    """A host whose agent's start ended by itself before its ranks finished: what its problem is told from."""

    host: str
    node_rank: int
    code: int  # the exit code of the process that started its agent
    command: list[str]  # that process's command line
    tail: list[str]  # that process's last lines on stderr
    connected: bool  # (connecting back) its agent had connected
    python: str  # the interpreter the agent runs with on the host


class AgentStart(Protocol):
    """One way to start an agent per host."""

    name: str  # start_hosts_with's value
    over_pipes: bool  # True: one process per host, its pipes the channel; False: one process, agents connect back
    node_addresses: list[str] | None  # each host's address where the start knows it (node 0 serves the store
    #                                   there), else None: node 0's agent says the address the kernel reached it on

    def command(self, hosts: list[str], agent: list[str]) -> list[str]:
        """The command that starts ``agent`` (its argv) on ``hosts`` (over pipes: one host)."""
        ...

    def env(self) -> dict[str, str] | None:
        """That command's environment (None: this kernel's)."""
        ...

    def problem(self, end: AgentEnd) -> str:
        """Why that host could not run its ranks, with what to check or fix."""
        ...


class SshStart(AgentStart):
    """Each host's agent over its own SSH connection: the agent reads its settings on stdin, sends on stdout."""

    name = "ssh"
    over_pipes = True
    node_addresses = None

    def __init__(self, ssh_options=None):
        self.ssh_options = list(ssh_options or [])

    def command(self, hosts: list[str], agent: list[str]) -> list[str]:
        [host] = hosts
        return ssh_command(host, self.ssh_options, [shlex.join(agent)])

    def env(self) -> dict[str, str] | None:
        return None

    def problem(self, end: AgentEnd) -> str:
        tail = "\n".join(f"  {line}" for line in end.tail) or "  (nothing on stderr)"
        check = check_ssh(end.host, self.ssh_options)  # the doctor's check says whether SSH itself works
        verdict = (f"The doctor's SSH check: {check.verdict}, {check.found}" +
                   (f"; fix: {check.fix}" if check.fix and check.verdict != "ok" else ""))
        return (f"host {end.host} (node {end.node_rank}) could not run its ranks: "
                f"`{shlex.join(end.command)}` exited with code {end.code}. Its last lines:\n{tail}\n"
                f"{verdict}.\nFix: {SSH_FIX} (`notebook_launcher.doctor()` runs the same SSH check); and "
                f"check that {end.python} exists there with notebook_launcher installed.")


class MpirunStart(AgentStart):
    """One agent per host, started by the MPI found (``mpirun_options`` added); each connects back."""

    name = "mpirun"
    over_pipes = False
    node_addresses = None

    def __init__(self, mpirun_options=None):
        self.mpirun_options = list(mpirun_options or [])
        self.hosts: list[str] = []

    def command(self, hosts: list[str], agent: list[str]) -> list[str]:
        self.hosts = list(hosts)
        command = mpirun_command(self.hosts, agent, self.mpirun_options)
        if not command:
            raise HostFailedError("start_hosts_with='mpirun' needs mpirun or mpiexec on this machine (Debian: "
                                  "apt-get install openmpi-bin); or use start_hosts_with='ssh'")
        return command

    def env(self) -> dict[str, str] | None:
        return None

    def problem(self, end: AgentEnd) -> str:
        return mpirun_problem(end.command, end.tail, self.hosts, end, end.code, end.python)


class SrunStart(AgentStart):
    """How ``coordinator.Cluster`` starts the agents with srun: one task per node of ``hosts``, a step of ``job``; each
    agent connects back, and node 0's ranks serve the store on the address Slurm reaches that node on."""

    name = "srun"
    over_pipes = False

    def __init__(self, job: SlurmJob, hosts: list[str], device: str = "cpu"):
        self.job = job
        self.hosts = hosts
        # all the job's nodes go without --nodelist (a job's node list may be longer than a command line takes)
        self.nodelist = [] if hosts == job.hosts else [f"--nodelist={','.join(hosts)}"]
        if len(self.nodelist[0] if self.nodelist else "") > ARG_MAX:
            raise SlurmError(f"hosts= names {len(hosts)} nodes, more than srun's command line takes: leave hosts out "
                             f"(every node of the job)")
        self.node_addresses = node_addresses(hosts)
        self.gpus = gpus_per_node(job.job_id) if device == "cuda" else {}

    def command(self, hosts: list[str], agent: list[str]) -> list[str]:
        """srun's command line; the step takes every CPU the job holds on its nodes (srun's default without
        --exact), overlapping the notebook's own step if it runs in one (batchspawner)."""
        count = str(len(self.hosts))
        gres = [f"--gres=gpu:{min(self.gpus.get(host, 0) for host in self.hosts)}"] if self.gpus else []
        return [shutil.which("srun") or "srun", f"--jobid={self.job.job_id}", f"--job-name={STEP_NAME}",
                "--overlap", "--nodes", count, "--ntasks", count, "--ntasks-per-node=1",
                *self.nodelist, "--kill-on-bad-exit=0", "--input=none",
                *gres, *agent]

    def env(self) -> dict[str, str]:
        return slurm_env()

    def problem(self, end: AgentEnd) -> str:
        lines = "\n".join(f"  {line}" for line in end.tail) or "  (nothing on stderr)"
        state = "its agent had connected" if end.connected else "its agent never connected back"
        return (f"host {end.host} (node {end.node_rank}) could not run its ranks ({state}): `{' '.join(end.command)}` "
                f"exited with code {end.code}. Its last lines:\n{lines}\nCheck the step by hand (`srun --jobid="
                f"{self.job.job_id} --overlap -N{len(self.hosts)} hostname`), that the same Python with "
                f"notebook_launcher exists on every node, and that the nodes reach this machine (the agents connect "
                f"back to it).")
