"""Launch overhead across two nodes: start_hosts_with="srun" against SSH (hosts=[...]) on the same machine.

Run:  .venv/bin/python benchmarks/slurm_launch.py   (options --reps 10 --nproc 1 --warmup 1 --skip-outside)

Launch -> return of a no-op, ``notebook_launcher(noop, num_processes=N, ...)`` with N = --nproc ranks on each of
two nodes (world size 2N), device="cpu", a fresh free use_port each call, the launchers' output to a log file:

- ssh:     hosts=["127.0.0.1", "127.0.0.2"] through a real key-only sshd on a free port (hosts_launch.py's
           LocalSshd), from this process;
- srun:    start_hosts_with="srun" inside an allocation: a long-lived "kernel" (this script with --driver, torch
           and notebook_launcher imported) runs under ``salloc -N2 --ntasks-per-node=N`` and times the call
           itself; the agents start as a step of that job (srun --overlap);
- outside: start_hosts_with="srun", slurm_options=["--nodes=2"] from this process, outside any job: salloc's
           allocation, the launch and giving the job back, all in the time (split, from the display's notes, into
           call -> "granted" and "granted" -> return). --skip-outside leaves it out.

The two nodes are the tests' real two-node Slurm (tests/helpers/slurm_cluster.py: munged, slurmctld, slurmd n1 and n2, both
NodeAddr 127.0.0.1), started here and stopped at the end, like the sshd. Every repetition runs each method once,
in an order rotated from one repetition to the next (ssh, srun, outside; srun, outside, ssh; ...), so drift and
background load hit every method alike. Printed: median, min and max of each, the ratios srun/ssh and
outside/ssh (of the medians, and the median, min and max of the per-repetition ratios), the load average at the
start and the end, and the cleanup checks (squeue empty, no daemon, slurmstepd, sshd, agent or rank left).
Results: benchmarks/results/slurm_launch.json (git-ignored). Before measuring, the script waits (up to 10 min)
until no pytest runs on the machine; --no-wait skips that. Runs as root (the test Slurm's daemons need it).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

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
from hosts_launch import HOSTS, LocalSshd, wait_for_no_pytest

import notebook_launcher as nl_pkg
from notebook_launcher import notebook_launcher
from notebook_launcher.display.text import TextDisplay

METHODS = ["ssh", "srun", "outside"]
LABELS = {"ssh": "ssh      hosts=[127.0.0.1, 127.0.0.2] over sshd",
          "srun": "srun     inside an allocation (salloc -N2)",
          "outside": "outside  slurm_options=['--nodes=2'], incl. salloc"}
CALL_TIMEOUT_S = 60.0  # notebook_launcher(timeout=...): a launch here takes a few seconds
GUARD_S = CALL_TIMEOUT_S + 30.0  # past this, the call is cut (watchdog, or the driver restarted)
DRIVER_START_S = 180.0  # salloc's grant and the driver's imports


def noop():  # defined in __main__: cloudpickle ships it by value to the agents
    return None


class NoteTimes(TextDisplay):
    """The text display (as display="text"), noting when each launcher note was said (time.monotonic())."""

    def __init__(self):
        super().__init__("[rank ${rank}] ")
        self.notes: list[tuple[float, str]] = []

    def note(self, text: str) -> None:
        self.notes.append((time.monotonic(), text))
        TextDisplay.note(text)

    def first(self, words: str) -> float | None:
        return next((at for at, text in self.notes if words in text), None)


def launch(nproc: int, **keywords) -> dict:
    """One timed launch of the no-op: {"s", "error", "notes"}."""
    display = NoteTimes()
    error = None
    start = time.monotonic()
    try:
        notebook_launcher(noop, num_processes=nproc, device="cpu", display=display, use_port=str(free_port()),
                          timeout=CALL_TIMEOUT_S, **keywords)
    except Exception as exc:  # noqa: BLE001 - reported as the sample's error
        error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
    end = time.monotonic()
    granted = display.first(" granted: ")
    return {"s": None if error else end - start, "error": error, "start": start, "end": end,
            "granted_after_s": None if granted is None else granted - start,
            "after_grant_s": None if granted is None else end - granted}


# --------------------------------------------------------------------------------------------------------------
# The kernel inside an allocation: this script with --driver, run under salloc
# --------------------------------------------------------------------------------------------------------------
def driver_main() -> int:
    """`slurm_launch.py --driver N`: one JSON command a line on stdin ({"quit": true} ends it), one JSON line back
    per launch. Whatever the launcher prints goes to stderr (the benchmark's log)."""
    nproc = int(sys.argv[sys.argv.index("--driver") + 1])
    channel = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.write(channel, json.dumps({"ready": True, "job": os.environ.get("SLURM_JOB_ID"),
                                  "nodes": os.environ.get("SLURM_JOB_NODELIST")}).encode() + b"\n")
    for line in sys.stdin:
        if json.loads(line).get("quit"):
            break
        sample = launch(nproc, start_hosts_with="srun")
        os.write(channel, json.dumps(sample).encode() + b"\n")
    return 0


class Driver:
    """salloc -N2 --ntasks-per-node=N -- python slurm_launch.py --driver N, in a session of its own."""

    def __init__(self, nproc: int, env: dict, log_path: str):
        self.nproc, self.env, self.log_path = nproc, env, log_path
        self.process: subprocess.Popen | None = None
        self.job: str | None = None
        self.restarts = 0
        self._buffer = b""

    def start(self) -> None:
        command = [shutil.which("salloc") or "salloc", "-N2", f"--ntasks-per-node={self.nproc}",
                   "--job-name=nl-bench-driver", "--", sys.executable, os.path.abspath(__file__), "--driver",
                   str(self.nproc)]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file,
                                            env=self.env, cwd=ROOT, start_new_session=True)
        self._buffer = b""
        reply = self._reply(DRIVER_START_S)
        if not reply or not reply.get("ready") or not reply.get("job"):
            self.stop()
            raise RuntimeError(f"the driver did not start under salloc (reply {reply!r}): see {self.log_path}")
        self.job = reply["job"]

    def pids(self) -> set:
        if self.process is None:
            return set()
        return {self.process.pid} | {p.pid for p in live_descendants(self.process.pid)}

    def _reply(self, limit_s: float) -> dict | None:
        deadline = time.monotonic() + limit_s
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(self.process.stdout.fileno(), 65536)
                if not chunk:
                    return None
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def launch(self) -> dict:
        try:
            self.process.stdin.write(b"{}\n")
            self.process.stdin.flush()
        except OSError as exc:
            reply = None
            error = f"the driver is gone ({exc})"
        else:
            reply = self._reply(GUARD_S)
            error = f"no answer within {GUARD_S:.0f} s"
        if reply is None:  # hung or dead: a fresh driver (and allocation) for the next repetitions
            self.stop()
            self.restarts += 1
            self.start()
            return {"s": None, "error": f"{error} (driver restarted)"}
        return reply

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        with contextlib.suppress(OSError, ValueError):
            process.stdin.write(b'{"quit": true}\n')
            process.stdin.close()
        try:
            process.wait(timeout=60)  # the driver exits, salloc gives the job back
        except subprocess.TimeoutExpired:
            kill_all([process, *live_descendants(process.pid)], wait_s=10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        with contextlib.suppress(OSError):
            process.stdout.close()
        self.process = None


# --------------------------------------------------------------------------------------------------------------
# Checks that nothing is left
# --------------------------------------------------------------------------------------------------------------
def load_slurm_cluster():
    """tests/helpers/slurm_cluster.py (SlurmCluster, slurm_missing)."""
    tests = os.path.join(ROOT, "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from helpers import slurm_cluster

    return slurm_cluster


def processes_naming(*needles: str) -> list[str]:
    """Live processes (not this one) whose command line or environment names one of the needles."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/stat") as file:
                if file.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                command = file.read().replace(b"\0", b" ")
            with open(f"/proc/{pid}/environ", "rb") as file:
                environ = file.read()
        except OSError:
            continue
        if any(needle.encode() in command or needle.encode() in environ for needle in needles):
            found.append(f"{pid} {command.decode(errors='replace').strip()[:120]}")
    return found


# --------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = arguments(__doc__, "slurm_launch")
    parser.add_argument("--reps", type=int, default=10, help="measured repetitions per method (default 10)")
    parser.add_argument("--nproc", type=int, default=1, help="ranks per node (default 1; world size 2*nproc)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up repetitions, not counted (default 1)")
    parser.add_argument("--skip-outside", action="store_true", help="leave out slurm_options from outside a job")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest suites to end")
    args = parse(parser, argv, smoke={"reps": 1, "warmup": 0, "no_wait": True})
    slurm_cluster = load_slurm_cluster()
    if (why := slurm_cluster.slurm_missing()) is not None:
        raise SystemExit(f"cannot run the test Slurm: {why}")
    if 2 * args.nproc > slurm_cluster.CPUS_PER_NODE:  # the driver's job and the outside one share the nodes
        raise SystemExit(f"--nproc at most {slurm_cluster.CPUS_PER_NODE // 2}: the test nodes declare "
                         f"{slurm_cluster.CPUS_PER_NODE} CPUs, and two jobs of --ntasks-per-node=N hold them at once")
    methods = [m for m in METHODS if not (args.skip_outside and m == "outside")]

    waited = 0.0 if args.no_wait else wait_for_no_pytest()
    workdir = tempfile.mkdtemp(prefix="nl_slurm_bench_")
    log_path = os.path.join(workdir, "launcher_output.log")
    for name in [name for name in os.environ if name.startswith(("SLURM_", "SALLOC_", "SRUN_", "SBATCH_"))]:
        del os.environ[name]  # this process is outside any job
    os.environ["NOTEBOOK_LAUNCHER_RUNS_DIR"] = os.path.join(workdir, "runs")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    loadavg_at_start = os.getloadavg()
    started = time.monotonic()
    cluster = sshd = driver = quiet = None
    cluster_dir = cluster_conf = slurm_version = None
    samples = {method: [] for method in methods}
    warmups = {method: [] for method in methods}
    cleanup: dict = {}
    setup_s: dict = {}
    try:
        at = time.monotonic()
        cluster = slurm_cluster.SlurmCluster()
        cluster_dir, cluster_conf = cluster.dir, cluster.conf
        cluster.start()
        setup_s["slurm_up"] = time.monotonic() - at
        os.environ["SLURM_CONF"] = cluster.conf
        slurm_version = cluster.run(["srun", "--version"], timeout=30).stdout.strip()
        at = time.monotonic()
        sshd = LocalSshd(workdir)
        setup_s["sshd_up"] = time.monotonic() - at
        at = time.monotonic()
        driver = Driver(args.nproc, {**cluster.client_env(), "PYTHONPATH": os.environ["PYTHONPATH"]}, log_path)
        driver.start()
        setup_s["driver_under_salloc_ready"] = time.monotonic() - at
        log(f"  Slurm up in {setup_s['slurm_up']:.1f} s, sshd on port {sshd.port}, driver in job {driver.job} "
            f"after {setup_s['driver_under_salloc_ready']:.1f} s", sys.stdout)
        quiet = Quiet(log_path)
        total = args.warmup + args.reps
        for rep in range(total):
            order = methods[rep % len(methods):] + methods[:rep % len(methods)]
            for method in order:
                if method == "srun":
                    sample = driver.launch()
                else:
                    keep = {sshd.server.pid} | driver.pids() | {p.pid for p in cluster.processes.values()}
                    with Watchdog(GUARD_S, keep=keep) as guard, quiet():
                        if method == "ssh":
                            sample = launch(args.nproc, hosts=HOSTS, ssh_options=sshd.options)
                        else:
                            sample = launch(args.nproc, start_hosts_with="srun", slurm_options=["--nodes=2"])
                    if guard.fired:
                        sample = {"s": None, "error": f"cut by the watchdog after {GUARD_S:.0f} s"}
                if method == "ssh":  # the sessions, agents and ranks of the launch are gone before the next one
                    gone_s, left = sshd.wait_remote_gone(10.0)
                    sample["remote_gone_after_s"] = gone_s
                    if left:
                        kill_all(sshd.remote_processes())
                elif method == "outside":  # the job given back (squeue empty but for the driver's)
                    deadline = time.monotonic() + 30
                    while ([j for j in cluster.jobs() if not j.startswith(f"{driver.job} ")]
                           and time.monotonic() < deadline):
                        time.sleep(0.2)
                sample["rep"] = rep
                (warmups if rep < args.warmup else samples)[method].append(sample)
            log(f"  ... repetition {rep + 1}/{total} done ({time.monotonic() - started:.0f} s)", sys.stdout)
        loadavg_at_end = os.getloadavg()
    finally:
        if quiet is not None:
            quiet.close()
        at = time.monotonic()
        if driver is not None:
            driver.stop()
            cleanup["driver_stop_s"] = round(time.monotonic() - at, 2)
        if sshd is not None:
            cleanup["sshd"] = sshd.stop()
        if cluster is not None:
            at = time.monotonic()
            cleanup["jobs_left_before_stop"] = cluster.wait_no_jobs(60)
            cleanup["wait_no_jobs_s"] = round(time.monotonic() - at, 2)
            at = time.monotonic()
            try:
                cluster.stop()
                cleanup["slurm_stop"] = "all daemons stopped"
            except Exception as exc:  # noqa: BLE001 - reported
                cleanup["slurm_stop"] = f"{type(exc).__name__}: {exc}"
            cleanup["slurm_stop_s"] = round(time.monotonic() - at, 2)
        cleanup["children_left_at_end"] = kill_all(live_descendants(os.getpid()), wait_s=5)
        time.sleep(0.5)
        needles = [workdir] + [needle for needle in (cluster_dir,) if needle]
        cleanup["processes_naming_the_work_dirs_left"] = processes_naming(*needles)
        errors = any(s.get("error") for rows in (samples, warmups) for row in rows.values() for s in row)
        if errors or "loadavg_at_end" not in locals():
            kept = os.path.join(os.path.dirname(os.path.abspath(args.output)), "slurm_launch.log")
            os.makedirs(os.path.dirname(kept), exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copyfile(log_path, kept)
                cleanup["launcher_output_log"] = kept
        shutil.rmtree(workdir, ignore_errors=True)
    cleanup["nothing_left"] = (not cleanup.get("jobs_left_before_stop") and cleanup.get("slurm_stop") ==
                               "all daemons stopped" and not cleanup["sshd"]["sshd_processes_left"] and
                               not cleanup["children_left_at_end"] and
                               not cleanup["processes_naming_the_work_dirs_left"])
    report = summarize(args, methods, samples, warmups)
    report["environment"].update(loadavg_at_start=loadavg_at_start, loadavg_at_end=loadavg_at_end,
                                 waited_for_pytest_s=round(waited, 1), slurm_conf=cluster_conf, slurm=slurm_version)
    report["setup_s"] = setup_s
    report["driver"] = {"job": driver.job, "restarts": driver.restarts}
    report["cleanup"] = cleanup
    report["total_runtime_s"] = round(time.monotonic() - started, 1)
    print_report(report)
    print(f"\ntotal runtime {report['total_runtime_s']:.0f} s")
    finish(args, report, {f"{name} (of medians)": value["of_medians"] for name, value in report["ratios"].items()})
    return 0 if cleanup["nothing_left"] else 1


def spread(values: list) -> dict:
    values = [value for value in values if value is not None]
    return {"median": median(values), "min": min(values, default=None), "max": max(values, default=None),
            "n": len(values)}


def summarize(args, methods: list, samples: dict, warmups: dict) -> dict:
    rows = {}
    for method in methods:
        rows[method] = {**{f"{k}_s" if k != "n" else k: v for k, v in spread([s["s"] for s in samples[method]]).items()},
                        "errors": [s["error"] for s in samples[method] if s.get("error")],
                        "samples": samples[method], "warmup": warmups[method]}
    if "outside" in methods:
        rows["outside"]["granted_after_s"] = spread([s.get("granted_after_s") for s in samples["outside"]])
        rows["outside"]["after_grant_s"] = spread([s.get("after_grant_s") for s in samples["outside"]])
    ratios = {}
    for method in methods[1:]:  # against ssh: of the medians, and per repetition (the two calls of one rep)
        paired = [ratio(b["s"], a["s"]) for a, b in zip(samples["ssh"], samples[method])]
        ratios[f"{method}/ssh"] = {"of_medians": ratio(rows[method]["median_s"], rows["ssh"]["median_s"]),
                                   "per_rep": spread(paired)}
    return {
        "benchmark": "slurm_launch",
        "settings": {"reps": args.reps, "warmup": args.warmup, "nproc_per_node": args.nproc,
                     "world_size": 2 * args.nproc, "methods": methods, "ssh_hosts": HOSTS,
                     "call_timeout_s": CALL_TIMEOUT_S},
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "notebook_launcher": getattr(nl_pkg, "__version__", "?"),
                        "ssh": subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False).stderr.strip(),
                        "cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "methods": rows,
        "ratios": ratios,
    }


def print_report(report: dict) -> None:
    settings, env, rows = report["settings"], report["environment"], report["methods"]
    print()
    print(f"Launch -> return of a no-op on 2 nodes, {settings['nproc_per_node']} rank(s) per node (world size "
          f"{settings['world_size']}): {settings['reps']} interleaved reps after {settings['warmup']} warm-up(s), ms")
    print(f"  torch {env['torch']}, {env['slurm']}, {env['ssh']}, {env['cpus']} CPUs")
    print(f"  load average (1 min) {env['loadavg_at_start'][0]:.2f} at start, {env['loadavg_at_end'][0]:.2f} at end "
          f"(5 min: {env['loadavg_at_start'][1]:.2f}, {env['loadavg_at_end'][1]:.2f})")
    print(f"  {'method':<52}{'median':>8}{'min':>8}{'max':>8}  errors")
    for method in settings["methods"]:
        row = rows[method]
        print(f"  {LABELS[method]:<52}{ms(row['median_s']):>8}{ms(row['min_s']):>8}{ms(row['max_s']):>8}  "
              f"{len(row['errors'])}")
    if "outside" in rows:
        for key, label in (("granted_after_s", "  of which call -> Slurm job granted"),
                           ("after_grant_s", "  of which granted -> return (launch, give back)")):
            part = rows["outside"][key]
            print(f"  {label:<52}{ms(part['median']):>8}{ms(part['min']):>8}{ms(part['max']):>8}")
    print()
    print(f"  {'ratio':<20}{'of medians':>12}{'per rep: median':>17}{'min':>8}{'max':>8}")
    for name, value in report["ratios"].items():
        per_rep = value["per_rep"]
        shown = [("n/a" if v is None else f"{v:.2f}x") for v in (value["of_medians"], per_rep["median"],
                                                                  per_rep["min"], per_rep["max"])]
        print(f"  {name:<20}{shown[0]:>12}{shown[1]:>17}{shown[2]:>8}{shown[3]:>8}")
    for method in settings["methods"]:
        for error in rows[method]["errors"][:3]:
            print(f"  error [{method}] {error}")
    setup = report["setup_s"]
    print(f"\n  setup: Slurm up {setup.get('slurm_up', 0):.1f} s, sshd {setup.get('sshd_up', 0):.1f} s, driver "
          f"under salloc ready {setup.get('driver_under_salloc_ready', 0):.1f} s (job {report['driver']['job']}, "
          f"restarts {report['driver']['restarts']})")
    cleanup = report["cleanup"]
    print(f"  cleanup: squeue before stop {cleanup.get('jobs_left_before_stop')}, Slurm: {cleanup.get('slurm_stop')}, "
          f"sshd processes left {cleanup['sshd']['sshd_processes_left']}, remote processes killed at stop "
          f"{cleanup['sshd']['remote_processes_killed_at_stop']}, children left {cleanup['children_left_at_end']}, "
          f"processes naming the work dirs {cleanup['processes_naming_the_work_dirs_left']}")
    print(f"  nothing left running: {'yes' if cleanup['nothing_left'] else 'NO'} (driver and its job stopped in "
          f"{cleanup.get('driver_stop_s')} s, squeue empty after {cleanup.get('wait_no_jobs_s')} s more, Slurm "
          f"stopped in {cleanup.get('slurm_stop_s')} s)")
    if cleanup.get("launcher_output_log"):
        print(f"  everything the launchers printed: {os.path.relpath(cleanup['launcher_output_log'])}")


if __name__ == "__main__":
    if "--driver" in sys.argv[1:]:
        sys.exit(driver_main())
    exit_with(main)
