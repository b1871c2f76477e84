"""Launch across hosts over SSH (hosts=[...]) and two-node c10d rendezvous, against baselines in the same run.

Run:  .venv/bin/python benchmarks/hosts_launch.py   (about 2 minutes; options --reps 10 --nproc 1 --warmup 1)

A real key-only sshd is started on 127.0.0.1 and 127.0.0.2 (two "hosts" on this machine) on a free port, as the
tests' `local_sshd` fixture does, and stopped at the end (checked gone). With N = --nproc ranks per host
(world size 2N), every repetition runs each method once, in an order rotated from one repetition to the next:

1. Launch -> return of a no-op function with a gloo process group up on every rank:
   a. hosts:      notebook_launcher(noop, num_processes=N, hosts=["127.0.0.1", "127.0.0.2"], ssh_options=...,
                  device="cpu", display="text", use_port=<free port>): each host's ranks started over SSH by
                  `python -m notebook_launcher.launchers.agent`, their events signed and carried back on the SSH channel;
   b. local:      notebook_launcher(noop, num_processes=2N, device="cpu", display="text", use_port=<free port>);
   c. ssh_import: the bare cost of SSH + an interpreter with torch imported on both hosts in parallel: two
                  `ssh <same options> HOST <python> -c "import torch.distributed"` run concurrently, wall time;
      ssh_true:   the same with `true` as the remote command (the SSH handshake alone), to split c;
   d. c10d / static: two long-lived "node" processes (this script with --node, torch already imported) each call
                  notebook_launcher(noop, num_processes=N, num_nodes=2, rdzv_backend="c10d",
                  rdzv_endpoint=127.0.0.1:<free port>, rdzv_id=<fresh>) -- or the static rendezvous (node_rank 0/1,
                  master_addr 127.0.0.1, use_port=<free port>); the time around the call is taken inside each node
                  process and the larger of the two is the sample.
   For (a), where the time goes is taken from the run's own frames (the agents' send times, same clock) and the
   moments the launching process started each ssh, got each host's first bytes and saw each channel close.
2. Teardown after a failure across hosts: rank 2N-1 raises ValueError as soon as its function starts (the process
   group is up); the other ranks wait in dist.barrier() for it. Measured: launch -> RankFailedError caught here
   (minus (a)'s median: the cost of the failure beyond a clean launch), the failing rank's raise -> caught (its
   time.monotonic() is written to a file; CLOCK_MONOTONIC is system wide), the rank blamed, and how long until
   every process under our sshd (the sessions, the agents -- command lines with "notebook_launcher.launchers.agent" -- and
   their ranks) is gone (must be within 10 s).

Everything the launchers print goes to a log file in a temporary directory (run logs too), removed at the end;
each call has a watchdog; no process is left (checked at the end). Results: a table on stdout and
benchmarks/results/hosts_launch.json (git-ignored). Before measuring, the script waits (up to 10 min, polling
every 20 s) until no pytest runs on the machine; --no-wait skips that.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import torch
from common import (
    ROOT,
    Quiet,
    Watchdog,
    arguments,
    exit_with,
    finish,
    free_port,
    kill_all,
    live_descendants,
    log,
    median,
    ms,
    parse,
    ratio,
)

import notebook_launcher as nl_pkg
from notebook_launcher import RankFailedError, notebook_launcher
from notebook_launcher.cluster import coordinator as cluster_module
from notebook_launcher.cluster import remote as remote_module

sys.path.insert(0, os.path.join(ROOT, "tests"))
from helpers.sshd import LocalSshd as TestSshd  # noqa: E402

HOSTS = ["127.0.0.1", "127.0.0.2"]
CALL_GUARD_S = 40.0  # a launch over SSH takes ~3 s here (~8 s with a DNS stall, see launch_overhead); a hang is cut
GONE_WITHIN_S = 10.0  # every remote process must be gone this long after the failure arrived
METHODS = ["hosts", "local", "ssh_import", "ssh_true", "c10d", "static", "failure"]
PYTEST_POLL_S, PYTEST_WAIT_S = 20.0, 600.0


# --------------------------------------------------------------------------------------------------------------
# Functions run on the ranks (defined in __main__: cloudpickle ships them by value to the agents)
# --------------------------------------------------------------------------------------------------------------
def noop():
    return None


def fail_last_rank(stamp_path):
    import time

    import torch.distributed as dist

    if dist.get_rank() == dist.get_world_size() - 1:
        raised_at = time.monotonic()
        with open(stamp_path, "w") as stamp:
            stamp.write(repr(raised_at))
        raise ValueError("the last rank fails on purpose (benchmark)")
    dist.barrier()  # never completes: the last rank never joins


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------
def cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def wait_for_no_pytest(limit_s: float = PYTEST_WAIT_S) -> float:
    """Other engineers run test suites on this machine: wait until none runs. Returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if subprocess.run(["pgrep", "-f", "pytest"], capture_output=True, check=False).returncode != 0:
            break
        log(f"  ... pytest is running on this machine; waiting ({time.monotonic() - started:.0f} s so far)",
            sys.stdout)
        time.sleep(PYTEST_POLL_S)
    return time.monotonic() - started


# --------------------------------------------------------------------------------------------------------------
# A real sshd on 127.0.0.1 and 127.0.0.2 (the tests' local_sshd)
# --------------------------------------------------------------------------------------------------------------
class LocalSshd(TestSshd):
    """The tests' sshd (tests/helpers/sshd.py), with what runs below it."""

    def __init__(self, workdir: str):
        super().__init__(os.path.join(workdir, "sshd"))

    def remote_processes(self) -> list[psutil.Process]:
        """Everything below our sshd: its sessions, the agents they run and the agents' ranks."""
        return live_descendants(self.server.pid)

    def wait_remote_gone(self, limit_s: float) -> tuple[float | None, list[str]]:
        """Seconds until nothing runs below sshd (None if something is still there after limit_s)."""
        started = time.monotonic()
        while True:
            left = self.remote_processes()
            if not left:
                return time.monotonic() - started, []
            if time.monotonic() - started > limit_s:
                return None, [f"{p.pid} {cmdline(p)[:100]}" for p in left]
            time.sleep(0.02)

    def stop(self) -> dict:
        left = kill_all(self.remote_processes())
        super().stop()
        still = [p.pid for p in psutil.process_iter(["cmdline"]) if self.config in " ".join(p.info["cmdline"] or [])]
        return {"remote_processes_killed_at_stop": left, "sshd_exit_code": self.server.returncode,
                "sshd_processes_left": still}


# --------------------------------------------------------------------------------------------------------------
# Where a launch across hosts spends its time: the launching side's moments and the agents' frames
# --------------------------------------------------------------------------------------------------------------
class ClusterTimeline:
    """Wraps a few Cluster methods (a list append each) to note: each ssh started, each host's first bytes (the
    agent is up: interpreter started, notebook_launcher and torch imported, settings read), every frame with the
    agent's send time (the same CLOCK_MONOTONIC on this machine), each channel's end, the stop."""

    def __init__(self):
        self.marks: list | None = None
        cls = cluster_module.Cluster
        originals = {name: getattr(cls, name) for name in ("_start", "_frames", "_handle", "_host_gone", "stop")}
        timeline = self

        def _start(self, node):
            timeline._mark("ssh_started", node.node_rank)
            return originals["_start"](self, node)

        def _frames(self, node, chunk):
            timeline._mark("bytes", node.node_rank)
            return originals["_frames"](self, node, chunk)

        def _handle(self, node, header, attachment):
            data = header.get("data") or {}
            kind = header.get("kind")
            if kind == "status":
                kind = f"status:{data.get('state')}"
            elif kind == cluster_module.AGENT_EVENT:
                kind = "agent:" + ",".join(sorted(data))
            timeline._mark(kind, node.node_rank, header.get("time"), header.get("rank"))
            return originals["_handle"](self, node, header, attachment)

        def _host_gone(self, node):
            timeline._mark("channel_closed", node.node_rank)
            return originals["_host_gone"](self, node)

        def stop(self, reason):
            timeline._mark(f"stop:{reason}", -1)
            return originals["stop"](self, reason)

        for name, wrapper in (("_start", _start), ("_frames", _frames), ("_handle", _handle),
                              ("_host_gone", _host_gone), ("stop", stop)):
            setattr(cls, name, wrapper)
        self._originals = originals

    def _mark(self, what, node, sent=None, rank=None):
        if self.marks is not None:
            self.marks.append((what, node, time.monotonic(), sent, rank))

    def uninstall(self):
        for name, original in self._originals.items():
            setattr(cluster_module.Cluster, name, original)

    def phases(self, call_at: float, returned_at: float) -> dict | None:
        marks = self.marks or []

        def last(what, sent=False):
            times = [(m[3] if sent else m[2]) for m in marks if m[0] == what]
            return max(times) if times else None

        def first_per_node_last(what):
            by_node = {}
            for m in marks:
                if m[0] == what and m[1] not in by_node:
                    by_node[m[1]] = m[2]
            return max(by_node.values()) if len(by_node) == len(HOSTS) else None

        milestones = [("call", call_at), ("ssh started", last("ssh_started")),
                      ("agents up (first bytes)", first_per_node_last("bytes")),
                      ("ranks starting", last("status:starting", sent=True)),
                      ("process group up", last("status:running", sent=True)),
                      ("ranks finished", last("status:finished", sent=True)),
                      ("ranks reaped", last("exit", sent=True)), ("agents done", last("agent:done", sent=True)),
                      ("channels closed", first_per_node_last("channel_closed")), ("returned", returned_at)]
        if any(moment is None for _, moment in milestones):
            return None
        phases = {}
        for (name_a, at_a), (name_b, at_b) in itertools.pairwise(milestones):
            phases[f"{name_a} -> {name_b}"] = at_b - at_a
        return phases

    def failure_phases(self, raised_at: float | None, caught_at: float) -> dict | None:
        marks = self.marks or []
        if raised_at is None:
            return None
        failure = [m for m in marks if m[0] == "failure"]
        stops = [m[2] for m in marks if m[0].startswith("stop:")]
        closed = [m[2] for m in marks if m[0] == "channel_closed"]
        done = [m[3] for m in marks if m[0] == "agent:done"]
        if not failure:
            return None
        out = {"raise -> failure frame sent by its agent": failure[0][3] - raised_at,
               "failure frame sent -> arrived here": failure[0][2] - failure[0][3]}
        if done:
            out["failure frame arrived -> last agent done"] = max(done) - failure[0][2]
        if stops:
            out["failure frame arrived -> stop sent to hosts"] = stops[0] - failure[0][2]
        if closed:
            out["failure frame arrived -> last channel closed"] = max(closed) - failure[0][2]
            out["last channel closed -> caught"] = caught_at - max(closed)
        out["stop_reason"] = next((m[0] for m in marks if m[0].startswith("stop:")), None)
        return out


# --------------------------------------------------------------------------------------------------------------
# Two long-lived "node" processes for the two-node c10d / static rendezvous
# --------------------------------------------------------------------------------------------------------------
def node_main() -> int:
    """`hosts_launch.py --node`: read one JSON command a line, launch, answer one JSON line with the call's
    start and end (time.monotonic()). Whatever the launcher prints goes to stderr (the benchmark's log)."""
    channel = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.write(channel, b'{"ready": true}\n')
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("quit"):
            break
        nproc = command["nproc"]
        error = None
        start = time.monotonic()
        try:
            if command["mode"] == "c10d":
                notebook_launcher(noop, num_processes=nproc, num_nodes=2, rdzv_backend="c10d",
                                  rdzv_endpoint=f"127.0.0.1:{command['port']}", rdzv_id=command["id"], device="cpu",
                                  display="text")
            else:
                notebook_launcher(noop, num_processes=nproc, num_nodes=2, node_rank=command["node_rank"],
                                  master_addr="127.0.0.1", use_port=str(command["port"]), device="cpu",
                                  display="text")
        except BaseException as exc:  # reported to the benchmark
            if isinstance(exc, KeyboardInterrupt):
                raise
            error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        end = time.monotonic()
        os.write(channel, json.dumps({"start": start, "end": end, "error": error}).encode() + b"\n")
    return 0


class Nodes:
    def __init__(self, log_path: str):
        self.log_path = log_path
        self.processes: list[subprocess.Popen] = []
        self._buffers: dict = {}

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the children, closed below
        self.processes = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--node"],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                           start_new_session=True) for _ in range(2)]
        log.close()
        self._buffers = {p.pid: b"" for p in self.processes}
        replies = self._read_replies(120.0)
        if replies is None or not all(reply.get("ready") for reply in replies):
            raise RuntimeError(f"the node processes did not start: see {self.log_path}")

    def pids(self) -> set:
        return {p.pid for p in self.processes}

    def _read_replies(self, limit_s: float):
        deadline = time.monotonic() + limit_s
        replies: dict = {}
        with selectors.DefaultSelector() as selector:
            for process in self.processes:
                selector.register(process.stdout, selectors.EVENT_READ, process)
            while len(replies) < len(self.processes):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                for key, _ in selector.select(left):
                    process = key.data
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        return None
                    self._buffers[process.pid] += chunk
                    if b"\n" in self._buffers[process.pid]:
                        line, self._buffers[process.pid] = self._buffers[process.pid].split(b"\n", 1)
                        replies[process.pid] = json.loads(line)
                        selector.unregister(process.stdout)
        return [replies[p.pid] for p in self.processes]

    def launch(self, mode: str, nproc: int, rep_id: str):
        """Both nodes get their command within microseconds; the sample is the slower node's call."""
        port = free_port()
        for node_rank, process in enumerate(self.processes):
            command = {"mode": mode, "nproc": nproc, "port": port, "id": rep_id, "node_rank": node_rank}
            process.stdin.write(json.dumps(command).encode() + b"\n")
            process.stdin.flush()
        replies = self._read_replies(CALL_GUARD_S)
        if replies is None:  # a hang (or a node died): start over with fresh node processes
            self.stop()
            self.start()
            return None, f"timed out after {CALL_GUARD_S:.0f} s (node processes restarted)", None
        errors = [reply["error"] for reply in replies if reply.get("error")]
        elapsed = [reply["end"] - reply["start"] for reply in replies]
        spread = max(reply["start"] for reply in replies) - min(reply["start"] for reply in replies)
        return (None if errors else max(elapsed)), ("; ".join(errors) or None), {"per_node_s": elapsed,
                                                                               "start_spread_s": spread}

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(OSError, ValueError):
                process.stdin.write(b'{"quit": true}\n')
                process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            with contextlib.suppress(OSError):
                process.stdout.close()
        self.processes = []


# --------------------------------------------------------------------------------------------------------------
# The methods
# --------------------------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args, workdir: str, sshd: LocalSshd, nodes: Nodes):
        self.args = args
        self.nproc = args.nproc
        self.workdir = workdir
        self.sshd = sshd
        self.nodes = nodes
        self.quiet = Quiet(os.path.join(workdir, "launcher_output.log"))
        self.timeline = ClusterTimeline()
        self.stamp_path = os.path.join(workdir, "last_rank_raised_at")
        self.ssh_base = ["ssh", *remote_module.SSH_BASE_OPTIONS, *sshd.options]  # what Cluster runs, + the command

    def keep(self) -> set:
        return {self.sshd.server.pid} | self.nodes.pids()

    def run(self, method: str, rep: int) -> dict:
        """One sample: {"s": seconds or None, "error": text or None, ...extra}."""
        if method in ("c10d", "static"):
            seconds, error, extra = self.nodes.launch(method, self.nproc, f"bench-{os.getpid()}-{rep}")
            return {"s": seconds, "error": error, **(extra or {})}
        out: dict = {"s": None, "error": None}
        # on overrun: the ssh clients, local workers and -- below sshd -- the sessions, agents and remote ranks go
        with Watchdog(CALL_GUARD_S, keep=self.keep()) as guard, self.quiet():
            try:
                if method == "hosts":
                    self.timeline.marks = []
                    start = time.monotonic()
                    notebook_launcher(noop, num_processes=self.nproc, hosts=HOSTS, ssh_options=self.sshd.options,
                                      device="cpu", display="text", use_port=str(free_port()))
                    end = time.monotonic()
                    out["s"] = end - start
                    out["phases"] = self.timeline.phases(start, end)
                    out["remote_left_at_return"] = len(self.sshd.remote_processes())
                elif method == "local":
                    start = time.monotonic()
                    notebook_launcher(noop, num_processes=2 * self.nproc, device="cpu", display="text",
                                      use_port=str(free_port()))
                    out["s"] = time.monotonic() - start
                elif method in ("ssh_import", "ssh_true"):
                    remote = (shlex.join([sys.executable, "-c", "import torch.distributed"])
                              if method == "ssh_import" else "true")
                    start = time.monotonic()
                    clients = [subprocess.Popen([*self.ssh_base, "--", host, remote], stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                               for host in HOSTS]
                    codes = [client.wait() for client in clients]
                    out["s"] = time.monotonic() - start
                    if any(codes):
                        out["s"], out["error"] = None, f"ssh exit codes {codes}"
                elif method == "failure":
                    out.update(self._failure())
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                out["s"], out["error"] = None, f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            finally:
                self.timeline.marks = None
        if guard.fired:
            out["s"], out["error"] = None, f"timed out after {CALL_GUARD_S:.0f} s (killed by the watchdog)"
        if method in ("hosts", "failure"):  # nothing of this launch may linger before the next method runs
            gone_s, left = self.sshd.wait_remote_gone(GONE_WITHIN_S)
            out["remote_gone_after_s"], out["remote_left"] = gone_s, left
            if method == "failure":
                out["agents_gone_within_10s"] = gone_s is not None and out.get("agents_gone_s") is not None
            if left:
                kill_all(self.sshd.remote_processes())
        return out

    def _failure(self) -> dict:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.stamp_path)
        out: dict = {"s": None, "error": None}
        self.timeline.marks = []
        start = time.monotonic()
        try:
            notebook_launcher(fail_last_rank, args=(self.stamp_path,), num_processes=self.nproc, hosts=HOSTS,
                              ssh_options=self.sshd.options, device="cpu", display="text", use_port=str(free_port()))
            out["error"] = "returned without raising"
            return out
        except RankFailedError as exc:
            caught_at = time.monotonic()
            out["blamed_rank"] = exc.rank
            out["failure_type"] = exc.failure.type
            out["failed_ranks"] = sorted(exc.failures)
        out["s"] = caught_at - start
        try:
            with open(self.stamp_path) as stamp:
                raised_at = float(stamp.read())
            out["raise_to_caught_s"] = caught_at - raised_at
        except (OSError, ValueError):
            raised_at = None
            out["raise_to_caught_s"] = None
        out["phases"] = self.timeline.failure_phases(raised_at, caught_at)
        # every agent (and its ranks) under our sshd gone within 10 s of the RankFailedError?
        deadline = caught_at + GONE_WITHIN_S
        while True:
            agents = [p for p in self.sshd.remote_processes() if "notebook_launcher.launchers.agent" in cmdline(p)]
            if not agents:
                out["agents_gone_s"] = time.monotonic() - caught_at
                break
            if time.monotonic() > deadline:
                out["agents_gone_s"] = None
                out["agents_left"] = [f"{p.pid} {cmdline(p)[:100]}" for p in agents]
                break
            time.sleep(0.01)
        return out


# --------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = arguments(__doc__, "hosts_launch")
    parser.add_argument("--reps", type=int, default=10, help="measured repetitions per method (default 10)")
    parser.add_argument("--nproc", type=int, default=1, help="ranks per host (default 1; world size 2*nproc)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up repetitions, not counted (default 1)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest suites to end")
    args = parse(parser, argv, smoke={"reps": 1, "warmup": 0, "no_wait": True})

    waited = 0.0 if args.no_wait else wait_for_no_pytest()
    workdir = tempfile.mkdtemp(prefix="nl_hosts_bench_")
    os.environ["NOTEBOOK_LAUNCHER_RUNS_DIR"] = os.path.join(workdir, "runs")  # inherited by the node processes
    loadavg_at_start = os.getloadavg()
    started = time.monotonic()
    sshd = nodes = bench = None
    samples = {method: [] for method in METHODS}
    warmups = {method: [] for method in METHODS}
    report = None
    cleanup: dict = {}
    try:
        sshd = LocalSshd(workdir)
        nodes = Nodes(os.path.join(workdir, "launcher_output.log"))
        nodes.start()
        bench = Bench(args, workdir, sshd, nodes)
        total = args.warmup + args.reps
        for rep in range(total):
            order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]
            for method in order:
                sample = bench.run(method, rep)
                (warmups if rep < args.warmup else samples)[method].append(sample)
            log(f"  ... repetition {rep + 1}/{total} done ({time.monotonic() - started:.0f} s)", sys.stdout)
        report = summarize(args, samples, warmups)
    finally:
        if nodes is not None:
            nodes.stop()
        if bench is not None:
            bench.timeline.uninstall()
            bench.quiet.close()
        if sshd is not None:
            cleanup["sshd"] = sshd.stop()
        leftovers = kill_all(live_descendants(os.getpid()))
        cleanup["children_left_at_end"] = leftovers
        agents = [p.pid for p in psutil.process_iter(["cmdline"])
                  if workdir in " ".join(p.info["cmdline"] or [])]
        cleanup["processes_naming_the_workdir_left"] = agents
        log_path = os.path.join(workdir, "launcher_output.log")
        if report is None or any(s.get("error") for rows in samples.values() for s in rows):
            kept = os.path.join(os.path.dirname(os.path.abspath(args.output)), "hosts_launch.log")
            os.makedirs(os.path.dirname(kept), exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copyfile(log_path, kept)
                cleanup["launcher_output_log"] = kept
        shutil.rmtree(workdir, ignore_errors=True)
    report["cleanup"] = cleanup
    report["environment"].update(loadavg_at_start=loadavg_at_start, waited_for_pytest_s=round(waited, 1))
    report["total_runtime_s"] = round(time.monotonic() - started, 1)
    print_report(report)
    print(f"\ntotal runtime {report['total_runtime_s']:.0f} s")
    return finish(args, report, {label: value for label, value in report["derived"].items() if "_over_" in label})


def summarize(args, samples: dict, warmups: dict) -> dict:
    rows = {}
    for method in METHODS:
        values = [s["s"] for s in samples[method] if s["s"] is not None]
        rows[method] = {"median_s": median(values), "min_s": min(values, default=None),
                        "max_s": max(values, default=None), "n": len(values),
                        "errors": [s["error"] for s in samples[method] if s.get("error")],
                        "samples": samples[method], "warmup": warmups[method]}
    med = {method: rows[method]["median_s"] for method in METHODS}
    hosts_phases = [s["phases"] for s in samples["hosts"] if s.get("phases")]
    if hosts_phases:
        rows["hosts"]["phases_median_s"] = {k: median([p[k] for p in hosts_phases]) for k in hosts_phases[0]}
    failure = samples["failure"]
    failure_phases = [s["phases"] for s in failure if s.get("phases")]
    if failure_phases:
        rows["failure"]["phases_median_s"] = {
            k: (median([p.get(k) for p in failure_phases]) if k != "stop_reason" else
                sorted({str(p.get(k)) for p in failure_phases}))
            for k in failure_phases[0]}
    rows["failure"]["raise_to_caught_median_s"] = median([s.get("raise_to_caught_s") for s in failure])
    rows["failure"]["agents_gone_median_s"] = median([s.get("agents_gone_s") for s in failure])
    rows["failure"]["agents_gone_max_s"] = max([s["agents_gone_s"] for s in failure
                                                if s.get("agents_gone_s") is not None], default=None)
    rows["failure"]["all_gone_within_10s"] = all(s.get("agents_gone_within_10s") for s in failure) and bool(failure)
    rows["failure"]["blamed_ranks"] = sorted({s.get("blamed_rank") for s in failure if "blamed_rank" in s})
    hosts_samples = samples["hosts"]
    rows["hosts"]["remote_left_at_return_max"] = max([s.get("remote_left_at_return", 0) for s in hosts_samples],
                                                     default=None)
    rows["hosts"]["remote_gone_after_return_median_s"] = median([s.get("remote_gone_after_s") for s in hosts_samples])
    derived = {
        "a_over_b (hosts / local)": ratio(med["hosts"], med["local"]),
        "a_over_c (hosts / ssh_import)": ratio(med["hosts"], med["ssh_import"]),
        "a_minus_c_s (our overhead beyond SSH + python + torch import)": (
            None if med["hosts"] is None or med["ssh_import"] is None else med["hosts"] - med["ssh_import"]),
        "c10d_over_static": ratio(med["c10d"], med["static"]),
        "failure_minus_a_s (teardown beyond a clean launch)": (
            None if med["failure"] is None or med["hosts"] is None else med["failure"] - med["hosts"]),
        "c_minus_ssh_true_s (python + torch import on both hosts)": (
            None if med["ssh_import"] is None or med["ssh_true"] is None else med["ssh_import"] - med["ssh_true"]),
    }
    return {
        "benchmark": "hosts_launch",
        "settings": {"reps": args.reps, "warmup": args.warmup, "nproc_per_host": args.nproc,
                     "world_size": 2 * args.nproc, "hosts": HOSTS, "methods": METHODS,
                     "call_guard_s": CALL_GUARD_S, "ssh_base_options": remote_module.SSH_BASE_OPTIONS,
                     "peer_report_grace_s": cluster_module.PEER_REPORT_GRACE_S},
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "notebook_launcher": getattr(nl_pkg, "__version__", "?"),
                        "ssh": subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False).stderr.strip(),
                        "cpus": len(os.sched_getaffinity(0)), "loadavg_at_end": os.getloadavg(),
                        "platform": platform.platform()},
        "methods": rows,
        "derived": derived,
    }


LABELS = {
    "hosts": "a  hosts=[2 hosts] over SSH",
    "local": "b  local, same world size",
    "ssh_import": "c  2x ssh + python -c 'import torch.distributed'",
    "ssh_true": "   2x ssh + `true` (handshake only)",
    "c10d": "d  2 nodes, c10d rendezvous",
    "static": "d' 2 nodes, static rendezvous",
    "failure": "2  hosts, last rank raises -> RankFailedError",
}


def print_report(report: dict) -> None:
    settings, env, rows = report["settings"], report["environment"], report["methods"]
    print()
    print(f"Launch across 2 hosts (127.0.0.1, 127.0.0.2 over a local sshd), {settings['nproc_per_host']} rank(s) per "
          f"host, world size {settings['world_size']}: median of {settings['reps']} interleaved reps after "
          f"{settings['warmup']} warm-up(s), ms")
    print(f"  torch {env['torch']}, {env['ssh']}, {env['cpus']} CPUs, load average "
          f"{env['loadavg_at_start'][0]:.2f} at start, {env['loadavg_at_end'][0]:.2f} at end")
    print(f"  {'method':<50}{'median':>8}{'min':>8}{'max':>8}  errors")
    for method in METHODS:
        row = rows[method]
        print(f"  {LABELS[method]:<50}{ms(row['median_s']):>8}{ms(row['min_s']):>8}{ms(row['max_s']):>8}  "
              f"{len(row['errors'])}")
    print()
    for name, value in report["derived"].items():
        shown = "n/a" if value is None else (f"{value * 1000:.0f} ms" if name.split(" ")[0].endswith("_s")
                                             else f"{value:.2f}x")
        print(f"  {name:<66} {shown:>9}")
    if rows["hosts"].get("phases_median_s"):
        print("\n  (a) where the time goes (median ms; agents' send times and this process's reads, one clock):")
        for name, value in rows["hosts"]["phases_median_s"].items():
            print(f"    {name:<58} {ms(value):>6}")
        print(f"    remote processes still there at return (max): {rows['hosts']['remote_left_at_return_max']}, "
              f"all gone {ms(rows['hosts']['remote_gone_after_return_median_s'])} ms after (median)")
    failure = rows["failure"]
    print(f"\n  (2) failure: raise -> caught {ms(failure['raise_to_caught_median_s'])} ms (median); blamed rank(s) "
          f"{failure['blamed_ranks']}; agents and ranks gone {ms(failure['agents_gone_median_s'])} ms after the "
          f"error (median, max {ms(failure['agents_gone_max_s'])}); all gone within 10 s: "
          f"{failure['all_gone_within_10s']}")
    for name, value in (failure.get("phases_median_s") or {}).items():
        print(f"    {name:<58} {str(value) if isinstance(value, list) else ms(value):>6}")
    for method in METHODS:
        for error in rows[method]["errors"][:3]:
            print(f"  error [{method}] {error}")
    cleanup = report["cleanup"]
    print(f"\n  cleanup: sshd exit code {cleanup['sshd']['sshd_exit_code']}, sshd processes left "
          f"{cleanup['sshd']['sshd_processes_left']}, remote processes killed at stop "
          f"{cleanup['sshd']['remote_processes_killed_at_stop']}, children left {cleanup['children_left_at_end']}, "
          f"processes naming the work dir {cleanup['processes_naming_the_workdir_left']}")
    if cleanup.get("launcher_output_log"):
        print(f"  everything the launchers printed: {os.path.relpath(cleanup['launcher_output_log'])}")


if __name__ == "__main__":
    if "--node" in sys.argv[1:]:
        sys.exit(node_main())
    exit_with(main)
