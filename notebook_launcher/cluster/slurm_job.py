"""Slurm, for launches across nodes (``start_hosts_with="srun"``) and the doctor: the job a launch runs in, its
nodes in Slurm's order with the addresses Slurm reaches them on and what each holds (CPUs, GPUs), the srun
command that starts one agent per node as a step of that job, and the checks of ``start_hosts_with="srun"``'s
arguments made before anything starts. (The doctor's Slurm checks: ``slurm_checks.py``.)

The job is the one this kernel runs in (``SLURM_JOB_ID`` set: a notebook server started by batchspawner, or a
kernel inside ``salloc``), or the one the launch asked for with ``slurm_options`` (``allocation.py``).

Each agent is task N of the step (``SLURM_PROCID``), on the step's N-th node: Slurm numbers a step's tasks in
the order of its nodes in the job, so the kernel lists the hosts in that order and host N is node rank N.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

from ..errors import HostFailedError, LaunchArgumentError

STEP_NAME = "notebook_launcher"  # the name of our steps (and jobs): what teardown looks for
_TIMEOUT_S = 30  # a Slurm command that answers nothing in this long: slurmctld is unreachable
# the job's own settings that srun would read as defaults of a step (-n, -c, ...): a step of ours sets its own
_JOB_ENV = re.compile(r"(SLURM|SRUN|SALLOC|SBATCH)_")
_KEEP_ENV = ("SLURM_CONF", "SLURM_CLUSTERS", "SLURM_TIME_FORMAT", "SLURM_CONF_SERVER")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_ID = re.compile(r"[0-9]+(?:_[0-9]+)?(?:\.[0-9]+)?")  # job 1234, array task 1234_7, step 1234.0
_NODE = re.compile(r"(?:[^,\s\[\]]|\[[^\[\]]*\])+")  # one name of a node list, its [ranges] included
_NODELIST = re.compile(rf"[,\s]*(?:{_NODE.pattern}(?:[,\s]+{_NODE.pattern})*)?[,\s]*")
MAX_HOSTS = 1_000_000  # nodes in one node list (the largest clusters have ~10^5)
ARG_MAX = 100_000  # characters of node names on one command line (Linux takes up to 131072 in one argument)
SALLOC_FIX = ("run the notebook inside an allocation (a batchspawner server, or a kernel started under salloc), or "
              "pass slurm_options=[...] (salloc's options, e.g. ['--nodes=2', '--time=30']) to ask Slurm for one")


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is its own."""


@dataclass
class SlurmJob:
    """A job's nodes, in Slurm's order, and what each holds."""

    job_id: str
    hosts: list[str]
    cpus: dict[str, int] = field(default_factory=dict)  # per node (SLURM_JOB_CPUS_PER_NODE)


def slurm_env(environ=None) -> dict[str, str]:
    """The environment for a Slurm command of ours: the job's own defaults (SLURM_NTASKS, SLURM_CPUS_PER_TASK,
    SRUN_*...) taken out, the cluster's configuration (SLURM_CONF) kept."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value in environ.items() if not _JOB_ENV.match(name) or name in _KEEP_ENV}


def checked_id(value, what: str = "Slurm job id") -> str:
    """A job or step id as Slurm writes it (``1234``, ``1234_7`` for an array task, ``1234.0`` for a step), or a
    SlurmError: an id read from Slurm's output or the environment reaches no command line unchecked."""
    text = str(value).strip()
    if not _ID.fullmatch(text):
        raise SlurmError(f"{what} {value!r} is not a Slurm job or step id (digits, e.g. 1234 or 1234.0)")
    return text


def run_slurm(command: list[str], timeout: float = _TIMEOUT_S) -> str:
    """A Slurm command's stdout, or SlurmError with what it said on stderr. Its output is decoded with
    replacement (a node's name or a reason in another encoding is no error); it runs in a session of its own,
    and a command that does not answer in ``timeout`` is killed with whatever it started."""
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=slurm_env(), start_new_session=True)
    except FileNotFoundError:
        raise SlurmError(f"{command[0]} is not installed here") from None
    except OSError as exc:  # E2BIG: a command line too long
        raise SlurmError(f"`{command[0]}` could not start ({exc.strerror})") from None
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise SlurmError(f"`{' '.join(command)}` did not answer in {timeout:g} s (is slurmctld reachable?)") from None
    except BaseException:
        _kill_group(process)
        raise
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if process.returncode != 0:
        said = " ".join(line.strip() for line in stderr.splitlines() if line.strip())
        raise SlurmError(said or f"`{' '.join(command)}` exited with code {process.returncode}")
    return stdout


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    for pipe in (process.stdout, process.stderr):
        pipe.close()


def scancel(*ids: str) -> None:
    """Cancel jobs or steps by id (each checked, after ``--``); SlurmError if scancel fails."""
    run_slurm(["scancel", "--quiet", "--", *(checked_id(one) for one in ids)])


def expand_counts(text: str) -> list[int]:
    """Slurm's per-node counts: ``"2(x3),1"`` → ``[2, 2, 2, 1]``."""
    counts = []
    for part in filter(None, (text or "").split(",")):
        match = _COUNT.fullmatch(part.strip())
        if not match:
            return []
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def hostnames(nodelist: str) -> list[str]:
    """``n[1-2],m3`` → ``["n1", "n2", "m3"]``, in Slurm's order, as ``scontrol show hostnames`` expands it; here,
    because a job's node list may be longer than a command line takes. A SlurmError if it is not a node list or
    names more than MAX_HOSTS nodes."""
    text = nodelist or ""
    if not _NODELIST.fullmatch(text):
        raise SlurmError(f"{_short(text)!r} is not a Slurm node list (e.g. n[1-4,7],gpu01)")
    hosts: list[str] = []
    for piece in _NODE.findall(text):
        parts = re.split(r"\[([^\[\]]*)\]", piece)  # prefix, ranges, infix, ranges, ..., suffix
        names = [parts[0]]
        for ranges, after in zip(parts[1::2], parts[2::2]):
            numbers = _numbers(ranges, text)
            if len(names) * len(numbers) + len(hosts) > MAX_HOSTS:
                raise SlurmError(f"the node list {_short(text)!r} names more than {MAX_HOSTS} nodes")
            names = [name + number + after for name in names for number in numbers]
        hosts += names
    return hosts


def _numbers(ranges: str, text: str) -> list[str]:
    """``01-03,7`` → ``["01", "02", "03", "7"]`` (zero-padded to the width of each range's first number)."""
    numbers: list[str] = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        if not first.isascii() or not first.isdigit() or (last and (not last.isascii() or not last.isdigit())):
            raise SlurmError(f"{_short(text)!r} is not a Slurm node list: [{ranges}] is not a list of numbers")
        low, high = int(first), int(last or first)
        if high < low or high - low + len(numbers) > MAX_HOSTS:
            raise SlurmError(f"{_short(text)!r} is not a Slurm node list: the range {part} is empty or too long")
        numbers += [str(number).zfill(len(first)) for number in range(low, high + 1)]
    return numbers


def _short(text: str) -> str:
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def job_from_fields(job_id: str, nodelist: str, cpus_per_node: str, source: str = "Slurm job id") -> SlurmJob:
    job_id = checked_id(job_id, source)
    hosts = hostnames(nodelist)
    cpus = expand_counts(cpus_per_node)
    return SlurmJob(job_id, hosts, dict(zip(hosts, cpus)) if len(cpus) == len(hosts) else {})


def job_from_env(environ=None) -> SlurmJob | None:
    """The job this process runs in (None outside one)."""
    environ = os.environ if environ is None else environ
    name = "SLURM_JOB_ID" if environ.get("SLURM_JOB_ID") else "SLURM_JOBID"
    if not environ.get(name):
        return None
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
    return job_from_fields(environ[name], nodelist, environ.get("SLURM_JOB_CPUS_PER_NODE", ""), name)


def node_addresses(hosts: list[str]) -> list[str]:
    """The address Slurm reaches each node on (its NodeAddr), in the order of ``hosts``: where the agents'
    connection back comes from, and where node 0's ranks serve the store. (Every node's, when the names are
    longer than a command line takes.)"""
    names = ",".join(hosts)
    text = run_slurm(["scontrol", "--oneliner", "--", "show", "node", *([names] if len(names) <= ARG_MAX else [])])
    found = {}
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return [found.get(host, host) for host in hosts]


def gpus_per_node(job_id: str) -> dict[str, int]:
    """The GPUs the job holds on each node (``scontrol show job -d``: ``Nodes=... GRES=gpu:2(IDX:0-1)``)."""
    gpus: dict[str, int] = {}
    for line in run_slurm(["scontrol", "--details", "--", "show", "job", checked_id(job_id)]).splitlines():
        nodes = re.search(r"\bNodes=(\S+)", line)
        gres = re.search(r"\bGRES=(\S*)", line)
        if not nodes or not gres or "CPU_IDs=" not in line:
            continue
        count = sum(int(number) for number in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres.group(1)))
        for host in hostnames(nodes.group(1)):
            gpus[host] = count
    return gpus


def option_nodes(options: list[str]) -> int:
    """How many nodes salloc's ``options`` ask for (``-N 2``, ``--nodes=2``, ``-w n[1-2]``; 1 without either)."""
    nodes = nodelist = None
    for index, option in enumerate(options):
        following = options[index + 1] if index + 1 < len(options) else ""
        for short, long in (("-N", "--nodes"), ("-w", "--nodelist")):
            value = None
            if option in (short, long):
                value = following
            elif option.startswith(long + "="):
                value = option[len(long) + 1:]
            elif option.startswith(short) and len(option) > 2 and not option.startswith("--"):
                value = option[2:]
            if value is not None and short == "-N":
                nodes = value
            elif value is not None:
                nodelist = value
    if nodes is not None:
        if not nodes.isdigit() or int(nodes) < 1:
            raise LaunchArgumentError(f"slurm_options asks for nodes={nodes!r}: give one number of nodes, e.g. "
                                      f"'--nodes=2' (a range such as 2-4 leaves the number of ranks open)")
        return int(nodes)
    if nodelist is not None:
        try:
            return len(hostnames(nodelist))
        except SlurmError as exc:
            raise LaunchArgumentError(f"slurm_options: the nodelist {nodelist!r} is not one Slurm reads "
                                      f"({exc})") from None
    return 1


_CPU_OPTIONS = ("-n", "--ntasks", "--ntasks-per-node", "-c", "--cpus-per-task", "--exclusive", "--mincpus",
                "--cpus-per-gpu")
_GPU_OPTIONS = ("-G", "--gpus", "--gpus-per-node", "--gpus-per-task", "--gres")


def _mentions(options: list[str], names: tuple[str, ...]) -> bool:
    return any(option == name or option.startswith(name + "=") or
               (not name.startswith("--") and option.startswith(name) and not option.startswith("--"))
               for option in options for name in names)


def allocation_options(options: list[str], num_processes: int, device: str) -> list[str]:
    """salloc's options for a launch of ``num_processes`` ranks per node: the user's, plus
    ``--ntasks-per-node=P`` (a CPU per rank) when they say nothing of tasks or CPUs, and ``--gpus-per-node=P``
    on CUDA when they ask for no GPUs."""
    extra = [] if _mentions(options, _CPU_OPTIONS) else [f"--ntasks-per-node={num_processes}"]
    if device == "cuda" and not _mentions(options, _GPU_OPTIONS):
        extra.append(f"--gpus-per-node={num_processes}")
    return [*options, *extra]


def resolve_srun_hosts(hosts, hostfile, num_nodes, node_rank, ssh_options, mpirun_options,
                       slurm_options) -> list[str]:
    """``start_hosts_with="srun"``'s arguments checked: the nodes of the job this kernel runs in (narrowed by
    ``hosts=``), or placeholders for the nodes ``slurm_options`` asks for. A LaunchArgumentError otherwise."""
    for name, value in (("hostfile", hostfile), ("ssh_options", ssh_options), ("mpirun_options", mpirun_options)):
        if value is not None:
            raise LaunchArgumentError(f"{name} is not used with start_hosts_with='srun': the nodes come from the "
                                      f"Slurm job (hosts=[...] may narrow them), options go in slurm_options")
    if num_nodes != 1 or node_rank != 0:
        raise LaunchArgumentError(f"with start_hosts_with='srun' every node of the job is a node, in Slurm's order: "
                                  f"leave num_nodes and node_rank out (got num_nodes={num_nodes}, "
                                  f"node_rank={node_rank})")
    if not shutil.which("srun"):
        raise LaunchArgumentError("start_hosts_with='srun': srun is not found on this machine's PATH; run the "
                                  "notebook where Slurm's commands are (a login or compute node), or add their "
                                  "folder to PATH")
    if slurm_options is not None:
        if isinstance(slurm_options, str) or not isinstance(slurm_options, (list, tuple)) or not all(
                isinstance(option, str) for option in slurm_options):
            raise LaunchArgumentError(f"slurm_options must be a list of salloc options such as ['--nodes=2', "
                                      f"'--time=30'], got {slurm_options!r}")
        if hosts is not None:
            raise LaunchArgumentError("hosts=[...] narrows the nodes of the job this kernel runs in; with "
                                      "slurm_options, name the nodes there (e.g. '--nodelist=n[1-2]')")
        return [f"slurm-node-{index}" for index in range(option_nodes(list(slurm_options)))]
    try:
        job = job_from_env()
    except SlurmError as exc:
        raise HostFailedError(f"start_hosts_with='srun': the Slurm job this kernel runs in cannot be read ({exc}); "
                              f"check SLURM_JOB_ID and SLURM_JOB_NODELIST, and that Slurm's commands work here "
                              f"(`sinfo`)") from None
    if job is None:
        raise LaunchArgumentError(f"start_hosts_with='srun' without slurm_options needs a Slurm allocation, and "
                                  f"this kernel is not in one (SLURM_JOB_ID is not set): {SALLOC_FIX}")
    if not job.hosts:
        raise LaunchArgumentError(f"Slurm job {job.job_id}: SLURM_JOB_NODELIST names no node")
    if hosts is None:
        return job.hosts
    if isinstance(hosts, str) or not isinstance(hosts, (list, tuple)) or not all(isinstance(h, str) for h in hosts):
        raise LaunchArgumentError(f"hosts must be a list of node names of Slurm job {job.job_id} "
                                  f"({', '.join(job.hosts)}), got {hosts!r}")
    wanted = [host.strip() for host in hosts]
    strangers = [host for host in wanted if host not in job.hosts]
    if strangers:
        raise LaunchArgumentError(f"hosts={list(hosts)!r}: {', '.join(strangers)} is not a node of Slurm job "
                                  f"{job.job_id} ({', '.join(job.hosts)}); give some of those, or leave hosts out")
    return [host for host in job.hosts if host in wanted]  # Slurm's order: task N of the step runs on host N


def check_fits(job: SlurmJob, hosts: list[str], num_processes: int, device: str) -> str | None:
    """More ranks per node than the job's GPUs on a node (on CUDA): a LaunchArgumentError. More than its CPUs:
    the warning to show (ranks may share CPUs; torchrun's pattern, one task per node, does), else None."""
    if device == "cuda":
        gpus = gpus_per_node(job.job_id)
        for host in hosts:
            if num_processes > gpus.get(host, 0):
                raise LaunchArgumentError(
                    f"num_processes={num_processes} ranks per node on CUDA, but Slurm job {job.job_id} holds "
                    f"{gpus.get(host, 0)} GPU(s) on {host}: give num_processes={gpus.get(host, 0) or 1} or less, or "
                    f"ask for GPUs per node (salloc or slurm_options '--gpus-per-node={num_processes}')")
    short = [f"{host} ({job.cpus[host]})" for host in hosts if job.cpus.get(host, num_processes) < num_processes]
    if not short:
        return None
    more = f" and {len(short) - 5} more nodes" if len(short) > 5 else ""
    return (f"warning: num_processes={num_processes} ranks per node, more than the CPUs Slurm job {job.job_id} "
            f"holds on {', '.join(short[:5])}{more}: the ranks share those CPUs. To give each rank its own, ask "
            f"for them (salloc or slurm_options '--cpus-per-task={num_processes}' with one task per node, or "
            f"'--ntasks-per-node={num_processes}')")


def job_state(job_id: str) -> str:
    """What squeue says of the job (``RUNNING``, ``SUSPENDED``, ...); "" when it cannot say."""
    try:
        return run_slurm(["squeue", "-h", f"--jobs={checked_id(job_id)}", "-o", "%T"], timeout=10).strip()
    except SlurmError:
        return ""


def cancel_steps(job_id: str) -> list[str]:
    """Cancel the steps of ours still in ``job_id`` (squeue lists them by name); returns the ids cancelled. Only
    ids of steps of that job are taken from squeue's answer."""
    job_id = checked_id(job_id)
    try:
        text = run_slurm(["squeue", "-h", "-s", f"--jobs={job_id}", "-o", "%i %j"])
    except SlurmError:
        return []
    steps = [words[0] for words in map(str.split, text.splitlines()) if words[1:] == [STEP_NAME]
             and _ID.fullmatch(words[0]) and words[0].startswith(f"{job_id}.")]
    if steps:
        with contextlib.suppress(SlurmError):
            scancel(*steps)
    return steps
