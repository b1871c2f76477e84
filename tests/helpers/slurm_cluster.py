"""A real two-node Slurm on this machine for the tests: munged, slurmctld, and slurmd for nodes n1 and n2, all on
loopback, on ports of their own, with every file in one temp dir.

``SlurmCluster.start()`` writes a munge key and a slurm.conf, starts the four daemons in the foreground (so the
pids are theirs, not a daemonized child's) and waits until ``sinfo`` shows both nodes idle; ``stop()`` stops each
daemon by its pid (SIGTERM, then SIGKILL), cancels any job left, and checks that none of the four is alive. The
clients (srun, salloc, squeue, ...) find this cluster through ``env`` (SLURM_CONF), which the fixture puts in
os.environ for the session.

Run as a script (``python tests/helpers/slurm_cluster.py``) it starts the cluster, prints its SLURM_CONF and waits for
Ctrl-C: handy to try srun by hand.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "squeue", "sinfo", "scancel", "scontrol")
NODES = ("n1", "n2")
CPUS_PER_NODE = 4  # declared (SlurmdParameters=config_overrides): two "nodes" of 4 on this 2-core machine
READY_S = 120.0  # generous: slurmctld and two slurmd register within seconds, but this machine is shared


def slurm_missing() -> str | None:
    """Why this machine cannot run the test cluster (None if it can): which binaries are absent."""
    missing = [name for name in DAEMONS if not shutil.which(name) and not os.path.exists(f"/usr/sbin/{name}")]
    if missing:
        return (f"Slurm/munge binaries not found ({', '.join(missing)}): `make system-deps` "
                f"(scripts/install_system_deps.sh) installs slurm-wlm and munge")
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (SlurmUser=root), and this is not root"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            sockets.append(probe)
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def _die_with_parent() -> None:
    """In the daemon before exec: SIGTERM when the test process dies, even by SIGKILL (prctl PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="nl-slurm-")
        os.chmod(self.dir, 0o700)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket")
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = self.client_env()  # the daemons'

    # -- start -----------------------------------------------------------------------------------------------
    def start(self) -> SlurmCluster:
        try:
            self._write_files()
            self._start("munged", [_binary("munged"), "-F", "-f", f"--socket={self.munge_socket}",
                                   f"--key-file={self.dir}/munge/munge.key", f"--log-file={self.dir}/munged.log",
                                   f"--pid-file={self.dir}/munged.pid", f"--seed-file={self.dir}/munge/seed"])
            self._wait(lambda: os.path.exists(self.munge_socket), 30, "munged's socket")
            self._start("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", self.conf])
            for node in NODES:
                self._start(f"slurmd {node}", [_binary("slurmd"), "-D", "-N", node, "-f", self.conf])
            self._wait(self._nodes_idle, READY_S, "sinfo showing n1 and n2 idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _write_files(self) -> None:
        os.makedirs(os.path.join(self.dir, "munge"), mode=0o700)
        os.makedirs(os.path.join(self.dir, "state"))
        for node in NODES:
            os.makedirs(os.path.join(self.dir, "spool", node))
        key = os.path.join(self.dir, "munge", "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "wb") as file:
            file.write(os.urandom(1024))
        ctld, *node_ports = _free_ports(1 + len(NODES))
        host = socket.gethostname().split(".")[0]
        nodes = "".join(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                        f"CPUs={CPUS_PER_NODE} State=UNKNOWN\n" for node, port in zip(NODES, node_ports))
        with open(self.conf, "w") as file:
            file.write(f"""ClusterName=nltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={self.dir}/state
SlurmdSpoolDir={self.dir}/spool/%n
SlurmctldPidFile={self.dir}/slurmctld.pid
SlurmdPidFile={self.dir}/slurmd-%n.pid
SlurmctldLogFile={self.dir}/slurmctld.log
SlurmdLogFile={self.dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=5
MessageTimeout=30
{nodes}PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""")

    def _start(self, name: str, command: list[str]) -> None:
        log = open(os.path.join(self.dir, f"{name.replace(' ', '-')}.out"), "wb")
        with log:
            self.processes[name] = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                                    stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
                                                    preexec_fn=_die_with_parent)

    def _wait(self, ready, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            dead = [name for name, process in self.processes.items() if process.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"the test Slurm did not come up ({what}; "
                                   f"{'exited: ' + ', '.join(dead) if dead else f'waited {seconds:g} s'}):\n"
                                   f"{self.logs()}")
            time.sleep(0.5)

    def _nodes_idle(self) -> bool:
        try:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30).stdout
        except subprocess.TimeoutExpired:
            return False
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        return all(states.get(node) == "idle" for node in NODES)

    # -- use -------------------------------------------------------------------------------------------------
    def client_env(self) -> dict[str, str]:
        """This process's environment as it is now (a test's NOTEBOOK_LAUNCHER_RUNS_DIR included), outside any
        job, with SLURM_CONF naming this cluster."""
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("SLURM_", "SALLOC_", "SRUN_", "SBATCH_"))}
        return {**env, "SLURM_CONF": self.conf}

    def run(self, command: list[str], timeout: float = 60, extra_env=None, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**self.client_env(), **(extra_env or {})}, **kwargs)

    def jobs(self) -> list[str]:
        """The jobs squeue lists (pending, running, completing): "id state reason" each."""
        out = self.run(["squeue", "-h", "-o", "%i %T %r"]).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def wait_no_jobs(self, seconds: float = 60) -> list[str]:
        """Waits (bounded) until squeue lists no job; returns what it lists then."""
        deadline = time.monotonic() + seconds
        while (jobs := self.jobs()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return jobs

    def cancel_all(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.run(["scancel", "--full", "--quiet", "-u", "root"], timeout=30)

    def logs(self) -> str:
        parts = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.dir, name), errors="replace") as file:
                    parts.append(f"--- {name}\n" + "".join(file.readlines()[-15:]))
        return "\n".join(parts)

    # -- stop ------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Every daemon stopped by its pid, slurmd first; raises if one is still alive afterwards."""
        if self.processes.get("slurmctld") is not None and self.processes["slurmctld"].poll() is None:
            self.cancel_all()
        order = [name for name in self.processes if name.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        alive = [name for name, process in self.processes.items() if process.poll() is None]
        steps = _slurmstepd_of(self.dir)
        for pid in steps:  # a step daemon of ours that outlived its slurmd
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)
        if alive or steps:
            raise RuntimeError(f"the test Slurm left processes behind: {alive} slurmstepd {steps}")


def _slurmstepd_of(directory: str) -> list[int]:
    """slurmstepd processes whose command line or environment names our config (ours, not another cluster's)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as file:
                if file.read().strip() != "slurmstepd":
                    continue
            with open(f"/proc/{pid}/environ", "rb") as file:
                if directory.encode() not in file.read():
                    continue
        except OSError:
            continue
        found.append(int(pid))
    return found


RESERVATION = "nl-test-hold"


def _left_behind(cluster, wait_s: float = 30) -> list[str]:
    """Processes (other than the daemons and this test) whose environment names the test cluster's config."""
    daemons = {process.pid for process in cluster.processes.values()}
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) in daemons or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as file:
                    if cluster.conf.encode() not in file.read():
                        continue
                with open(f"/proc/{pid}/cmdline", "rb") as file:
                    command = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
                with open(f"/proc/{pid}/stat") as file:
                    if file.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue  # a zombie its parent is about to reap
            except OSError:
                continue
            if command and "slurmstepd" not in command and "slurmscriptd" not in command:
                found.append(f"{pid} {command}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def hold_the_nodes(cluster) -> None:
    """A maintenance reservation over both nodes: a job asking for them pends (ReqNodeNotAvail)."""
    done = cluster.run(["scontrol", "create", "reservation", f"ReservationName={RESERVATION}", "Nodes=ALL",
                        "StartTime=now", "Duration=30", "Users=nobody", "Flags=maint,ignore_jobs"])
    assert done.returncode == 0, done.stderr


if __name__ == "__main__":
    cluster = SlurmCluster().start()
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
