"""SSH and MPI helpers shared by launches across hosts (``cluster.py``) and the doctor's checks (``doctor.py``).

One place for what both need: the host names we accept, reading a hostfile, the ssh options and the fix text,
finding the MPI implementation, and the SSH and mpirun checks the doctor runs and a failed launch quotes.

Host names are checked before anything runs because they end up as arguments of ssh and mpirun: a "host" such
as ``-oProxyCommand=...`` would be an ssh option that runs a local command. ``--`` before the host in every ssh
command line is a second guard; for mpirun, which has no such marker, the checked names are what protect it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import LaunchArgumentError

OK, WARNING, PROBLEM = "ok", "warning", "problem"
SSH_BASE_OPTIONS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ServerAliveInterval=5",
                    "-o", "ServerAliveCountMax=3", "-o", "ConnectTimeout=15"]
SSH_FIX = ("make each host reachable by key (`ssh-keygen`, then `ssh-copy-id HOST`) and check the host name, the "
           "port and the firewall")
HOST_FORMS = ("a DNS name or SSH alias (node-a, node-a.example.com), an IPv4 address (10.0.0.2) or an IPv6 address "
              "(fe80::1 or [fe80::1]), optionally with user@ before it (alice@node-a)")
_SSH_TIMEOUT_S = 5
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?\.?")  # labels: letters, digits, _ - .
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a tab may separate a host from slots=N
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_SCOPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # the zone of a link-local IPv6 address (fe80::1%eth0)


@dataclass
class Check:
    """One verdict of the doctor (ok / warning / problem), what it found, and the fix."""

    name: str
    verdict: str
    found: str
    fix: str = ""


def host_problem(host: str) -> str | None:
    """Why ``host`` is not a host we pass to ssh or mpirun (None if it is one)."""
    user, at, name = host.rpartition("@")
    if host.startswith("-"):
        return "it starts with '-', which ssh and mpirun would read as an option"
    if at and not _USER.fullmatch(user):
        return f"{user!r} is not a user name (letters, digits, _ . - only)"
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
        if ":" not in name:
            return "only an IPv6 address goes in [brackets]"
    if ":" in name:
        address, percent, scope = name.partition("%")
        if percent and not _SCOPE.fullmatch(scope):
            return f"{scope!r} is not an IPv6 zone (an interface name: letters, digits and _ . - only)"
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return f"{name!r} is not an IPv6 address (a port goes in ssh_options, e.g. ['-p', '2222'])"
        return None
    if not name:
        return "the host name is empty"
    if not _NAME.fullmatch(name) or ".." in name:
        return "a host name has only letters, digits and _ . - (no spaces, quotes or other signs)"
    return None


def without_user(host: str) -> str:
    """The host of ``user@host`` (what to resolve or route to)."""
    return host.rpartition("@")[2]


def normalize_host(host: str) -> str:
    """The form ssh takes: ``[fe80::1]`` becomes ``fe80::1`` (ssh does not read brackets)."""
    user, at, name = host.rpartition("@")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return f"{user}{at}{name}"


def check_hosts(hosts) -> list[str]:
    """``hosts=[...]`` checked and normalized, or a LaunchArgumentError naming the entry and the forms accepted."""
    if isinstance(hosts, str) or not isinstance(hosts, (list, tuple)) or not hosts or not all(
            isinstance(host, str) and host.strip() for host in hosts):
        raise LaunchArgumentError(f"hosts must be a list of host names or addresses, got {hosts!r}")
    checked = []
    for index, host in enumerate(hosts):
        problem = host_problem(host.strip())
        if problem:
            raise LaunchArgumentError(f"hosts[{index}]={host!r} is not a host: {problem}. Give {HOST_FORMS}.")
        checked.append(normalize_host(host.strip()))
    return checked


def read_hostfile(path: str) -> list[str]:
    """One host per line; an MPI hostfile works (``host slots=4``, ``host:4``, ``[fe80::1]:4``); # starts a
    comment. Every host is checked as ``hosts=`` entries are: a bad line is a LaunchArgumentError naming the
    hostfile and the line."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise LaunchArgumentError(f"hostfile={path!r} cannot be read ({exc.strerror}): give a readable file with "
                                  f"one host per line") from None
    hosts = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LaunchArgumentError(
                f"hostfile={path!r}, line {number}: not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                f"{exc.start + 1}); a hostfile is a text file with one host per line: is this the right file?"
            ) from None
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        word = line.split()[0]
        if "[" in word and "]" in word:
            host = word[:word.index("]") + 1]  # [fe80::1] or [fe80::1]:4
        elif word.count(":") > 1:
            host = word  # a bare IPv6 address (no :slots then)
        else:
            host = word.split(":")[0]  # host or host:slots
        problem = host_problem(host) or ("the line has a control character" if _CONTROL.search(line) else None)
        if problem:
            raise LaunchArgumentError(f"hostfile={path!r}, line {number}: {word!r} is not a host: {problem}. "
                                      f"Each line is a host ({HOST_FORMS}), then optionally slots=N.")
        hosts.append(normalize_host(host))
    return hosts


def ssh_command(host: str, ssh_options, remote: list[str]) -> list[str]:
    """ssh with our base options and the user's, then ``--``: nothing after it is read as an ssh option."""
    return ["ssh", *SSH_BASE_OPTIONS, *ssh_options, "--", host, *remote]


def check_ssh(host: str, ssh_options=()) -> Check:
    """SSH to ``host`` without a password (BatchMode: never prompt)."""
    problem = host_problem(host)
    if problem:
        return Check(f"ssh {host!r}", PROBLEM, f"not a host: {problem}", f"give {HOST_FORMS}")
    host = normalize_host(host)
    command = ["ssh", "-o", f"ConnectTimeout={_SSH_TIMEOUT_S}", *SSH_BASE_OPTIONS, *ssh_options, "--", host, "true"]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=_SSH_TIMEOUT_S + 5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(f"ssh {host}", PROBLEM, f"no answer ({type(exc).__name__})", SSH_FIX)
    if completed.returncode == 0:
        return Check(f"ssh {host}", OK, "reachable without a password")
    reason = (completed.stderr.strip().splitlines() or [f"exit code {completed.returncode}"])[-1]
    return Check(f"ssh {host}", PROBLEM, reason, SSH_FIX)


def mpi_implementation() -> tuple[str | None, str]:
    """(path of mpirun or mpiexec, "Open MPI" | "MPICH" | "Intel MPI" | "unknown")."""
    path = shutil.which("mpirun") or shutil.which("mpiexec")
    if not path:
        return None, ""
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return path, "unknown"
    for marker, name in (("Open MPI", "Open MPI"), ("OpenRTE", "Open MPI"), ("HYDRA", "MPICH"),
                         ("MPICH", "MPICH"), ("Intel", "Intel MPI")):
        if marker in text:
            return path, name
    return path, "unknown"


def mpirun_command(hosts: list[str], agent: list[str], options=()) -> list[str]:
    """One ``agent`` per host, started by the MPI found, with ``AGENT_ENV_VAR`` forwarded ([] without MPI)."""
    from .agent_channel import AGENT_ENV_VAR

    path, name = mpi_implementation()
    if not path:
        return []
    if name == "Open MPI":
        command = [path, "--host", ",".join(f"{host}:1" for host in hosts), "-np", str(len(hosts)),
                   "-x", AGENT_ENV_VAR]
        if os.geteuid() == 0:
            command.append("--allow-run-as-root")
    else:  # MPICH, Intel MPI (Hydra)
        command = [path, "-hosts", ",".join(hosts), "-n", str(len(hosts)), "-ppn", "1", "-genvlist", AGENT_ENV_VAR]
    return command + list(options) + agent


def mpi_sanity_run(hostfile: str, processes: int) -> Check:
    """The guide's sanity run: one process per host printing its host name, with the flags of the
    implementation found (Open MPI: --hostfile/-np/--map-by ppr:1:node; MPICH: -f/-n/-ppn 1). The hostfile's
    hosts are checked first: mpirun would pass them to ssh."""
    try:
        read_hostfile(hostfile)
    except LaunchArgumentError as exc:
        return Check("mpirun sanity run", PROBLEM, f"not run: {exc}", "fix the hostfile")
    path, name = mpi_implementation()
    if not path:
        return Check("mpirun sanity run", PROBLEM, "no mpirun/mpiexec found",
                     "install Open MPI or MPICH (Debian: apt-get install openmpi-bin)")
    if name == "Open MPI":
        command = [path, "--hostfile", hostfile, "-np", str(processes), "--map-by", "ppr:1:node"]
        if os.geteuid() == 0:
            command.append("--allow-run-as-root")
        command.append("hostname")
    else:
        command = [path, "-f", hostfile, "-n", str(processes), "-ppn", "1", "hostname"]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("mpirun sanity run", PROBLEM, f"{' '.join(command)}: {type(exc).__name__}",
                     "run it by hand to see where it stops")
    names = [line.strip() for line in completed.stdout.splitlines() if line.strip()]
    if completed.returncode != 0:
        error = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("mpirun sanity run", PROBLEM, f"`{' '.join(command)}` failed: {error}",
                     "check the hostfile, SSH to each host, and the same MPI on every host")
    return Check("mpirun sanity run", OK, f"{name}: {len(names)} host name(s) printed: {', '.join(names)}")


def mpirun_problem(command: list[str], tail: list[str], hosts: list[str], node, code: int, python: str) -> str:
    """mpirun ended before this host's agent finished: what mpirun said, then the doctor's sanity run."""
    import shlex
    import tempfile

    lines = "\n".join(f"  {line}" for line in tail) or "  (nothing on stderr)"
    with tempfile.NamedTemporaryFile("w", suffix=".hosts") as hostfile:
        hostfile.write("".join(f"{host}\n" for host in hosts))
        hostfile.flush()
        check = mpi_sanity_run(hostfile.name, len(hosts))
    connected = "its agent had connected" if node.connected else "its agent never connected back"
    return (f"host {node.host} (node {node.node_rank}) could not run its ranks ({connected}): "
            f"`{shlex.join(command)}` exited with code {code}. Its last lines:\n{lines}\n"
            f"The doctor's mpirun sanity run: {check.verdict}, {check.found}"
            + (f"; fix: {check.fix}" if check.verdict != "ok" else "") +
            f".\nAlso check that {python} exists on every host with notebook_launcher installed, and "
            f"that the hosts can reach this machine (the agents connect back to it).")


def resolve_hosts(hosts, hostfile, num_nodes, node_rank, ssh_options, start_hosts_with="ssh",
                  mpirun_options=None, slurm_options=None) -> list[str]:
    """The hosts to start ranks on ([] for a launch on this machine only), checked before anything starts."""
    if start_hosts_with not in ("ssh", "mpirun", "srun"):
        raise LaunchArgumentError(f"start_hosts_with={start_hosts_with!r}: use 'ssh' (the default), 'mpirun' or "
                                  f"'srun' (Slurm)")
    if start_hosts_with == "srun":
        from .slurm_job import resolve_srun_hosts

        return resolve_srun_hosts(hosts, hostfile, num_nodes, node_rank, ssh_options, mpirun_options, slurm_options)
    if slurm_options is not None:
        raise LaunchArgumentError("slurm_options is for start_hosts_with='srun' (ranks started by Slurm's srun)")
    if mpirun_options is not None and (start_hosts_with != "mpirun" or isinstance(mpirun_options, str) or
                                       not all(isinstance(option, str) for option in mpirun_options)):
        raise LaunchArgumentError(f"mpirun_options must be a list of mpirun arguments, with "
                                  f"start_hosts_with='mpirun' (got {mpirun_options!r})")
    if hosts is not None and hostfile is not None:
        raise LaunchArgumentError("give hosts=[...] or hostfile=..., not both")
    if hostfile is not None:
        if not os.path.isfile(str(hostfile)):
            raise LaunchArgumentError(f"hostfile={hostfile!r} is not a file: give a file with one host per line")
        hosts = read_hostfile(str(hostfile))
        if not hosts:
            raise LaunchArgumentError(f"hostfile={hostfile!r} lists no host: one host name or address per line")
    if ssh_options is not None and start_hosts_with == "mpirun":
        raise LaunchArgumentError("ssh_options is for start_hosts_with='ssh'; with mpirun, give its own options in "
                                  "mpirun_options (e.g. ['--mca', 'plm_rsh_agent', 'ssh -p 2222'] for Open MPI)")
    if hosts is None:
        if ssh_options is not None:
            raise LaunchArgumentError("ssh_options is only used with hosts=[...] or hostfile=...")
        return []
    hosts = check_hosts(hosts)
    if len(set(hosts)) != len(hosts):
        raise LaunchArgumentError(f"hosts lists a host twice ({hosts}): one entry per host, each runs "
                                  f"num_processes ranks")
    if num_nodes not in (1, len(hosts)) or node_rank != 0:
        raise LaunchArgumentError(f"with hosts=[...] every host is a node, numbered in the order given: leave "
                                  f"num_nodes and node_rank out (got num_nodes={num_nodes}, node_rank={node_rank})")
    if ssh_options is not None and (isinstance(ssh_options, str) or
                                    not all(isinstance(option, str) for option in ssh_options)):
        raise LaunchArgumentError(f"ssh_options must be a list of ssh arguments such as ['-p', '2222', '-i', "
                                  f"'~/.ssh/id_ed25519'], got {ssh_options!r}")
    return hosts
