"""Launch overhead and failure propagation: notebook_launcher vs. bare torch.multiprocessing vs. Accelerate.

Run:  .venv/bin/python benchmarks/launch_overhead.py   (or `make bench`)
      options: --reps 20 --warmup 2 --sizes 2,4 --skip-accelerate

What is measured (all in this one process, repetitions interleaved: every repetition runs every method once, in
an order rotated from one repetition to the next, so drift and background load hit all methods alike):

1. Launch overhead, call -> return, of a no-op function with a gloo process group up on every rank, N = 2 and 4:
   - ours:       notebook_launcher(noop, num_processes=N, start_method="fork", device="cpu", use_port=<free port>)
                 (the process group is initialized by us before the function runs, so the function is a no-op;
                 every method gets a fresh free port, so that none collides with other launches on the machine
                 at the shared default 29500);
   - bare:       torch.multiprocessing.start_processes(fn, nprocs=N, start_method="fork", join=True), where fn
                 does init_process_group("gloo", env://, MASTER_ADDR=127.0.0.1, a free port) and
                 destroy_process_group();
   - accelerate: accelerate.notebook_launcher(fn, num_processes=N, use_port=<free port>) (torch elastic, fork),
                 fn does init_process_group("gloo", env://) from the RANK/WORLD_SIZE/MASTER_* that elastic sets,
                 then destroy_process_group().
2. Failure propagation, N = 2: rank 1 raises while rank 0 is blocked in dist.all_reduce. Rank 1 writes
   time.monotonic() to a file just before raising; the time is measured from there to the moment the launcher's
   exception is caught here (CLOCK_MONOTONIC is system wide on Linux, so the clocks agree across processes).
   The rank each launcher names as the failing one is recorded too.

Everything the launchers and workers print goes to a log file in a temporary directory (file descriptors 1 and 2
and sys.stdout/sys.stderr are redirected during each timed call, for every method alike), so printing does not
dominate. Torch elastic's temporary log directories, our run logs and that log file live in the same temporary
directory, removed at the end. Each call is bounded by a watchdog that SIGKILLs this process's descendants if it
overruns; no child process survives the script (checked at the end).

Results: a table on stdout and benchmarks/results/launch_overhead.json (raw samples, medians, ratios, aims).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from common import (
    Quiet,
    Watchdog,
    arguments,
    finish,
    fmt_ratio,
    free_port,
    kill_descendants,
    live_descendants,
    log,
    median,
    ms,
    parse,
    ratio,
)

import notebook_launcher as nl_pkg
from notebook_launcher import RankFailedError, last_run, notebook_launcher

LAUNCH_GUARD_S = 8.0  # a no-op launch takes < 0.3 s, or ~5.1 s with a DNS stall (README); a hang is cut here
FAILURE_GUARD_S = 8.0
MAX_TIMEOUTS = 6  # a method that hangs this often for one N is not run again for it (bounds the runtime)
RANK1_DELAY_S = 0.05  # rank 1 waits this long (outside the measured window) so rank 0 is surely blocked
AIM_OURS_OVER_BARE = 1.2
AIM_ACCELERATE_OVER_OURS = 2.0
AIM_FAILURE_S = 0.050
SLOW_S = 1.0  # a sample this slow is a stall (see README), counted separately; the median ignores it

STAMP_PATH = ""  # set in main(); inherited by forked workers


# --------------------------------------------------------------------------------------------------------------
# Functions run on the ranks (module level, so every start method could pickle them by reference)
# --------------------------------------------------------------------------------------------------------------
def ours_noop():
    return None


def bare_noop(rank, world_size):
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
    dist.destroy_process_group()


def accelerate_noop():
    dist.init_process_group("gloo", init_method="env://")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from elastic
    dist.destroy_process_group()


def _fail_on_rank_1(rank):
    dist.barrier()  # both ranks are in the group before anyone fails
    if rank == 1:
        time.sleep(RANK1_DELAY_S)  # rank 0 is blocked in all_reduce by now
        raised_at = time.monotonic()
        with open(STAMP_PATH, "w") as stamp:
            stamp.write(repr(raised_at))
        raise RuntimeError("rank 1 fails on purpose (benchmark)")
    dist.all_reduce(torch.ones(1))  # never completes: rank 1 never joins


def ours_fail():
    _fail_on_rank_1(dist.get_rank())


def bare_fail(rank, world_size):
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
    _fail_on_rank_1(rank)


def accelerate_fail():
    dist.init_process_group("gloo", init_method="env://")
    _fail_on_rank_1(dist.get_rank())


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------
def dump_stacks_of_descendants() -> None:
    """Before the watchdog kills a hung call: each descendant's kernel wait channel, and its Python stacks if
    py-spy is on PATH (or in $PY_SPY), into the launcher log (kept in benchmarks/results/ when a call failed)."""
    py_spy = os.environ.get("PY_SPY") or shutil.which("py-spy")
    for pid in [process.pid for process in live_descendants()]:
        try:
            with open(f"/proc/{pid}/wchan") as wchan, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                where = wchan.read()
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        lines = [f"[watchdog] pid {pid} ({command}) waiting in {where or '?'}"]
        if py_spy:
            try:
                dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                                      timeout=10)
                lines.append(dump.stdout + dump.stderr)
            except (OSError, subprocess.SubprocessError) as exc:
                lines.append(f"[watchdog] py-spy failed: {exc}")
        os.write(2, ("\n".join(lines) + "\n").encode())  # fd 2 is the launcher log during a timed call


@contextlib.contextmanager
def master_env(port: int):
    """MASTER_ADDR/MASTER_PORT for the bare baseline (forked children inherit os.environ)."""
    old = {key: os.environ.get(key) for key in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


HANDLED_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2]


@contextlib.contextmanager
def restore_signal_handlers(record: dict, method: str):
    """Torch elastic leaves its SIGTERM/SIGHUP/SIGQUIT handlers installed: put ours back after each call, so the
    other methods' forked workers do not inherit them (that would change how SIGTERM ends a worker)."""
    before = {signum: signal.getsignal(signum) for signum in HANDLED_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            if signal.getsignal(signum) is not handler:
                record.setdefault(method, set()).add(signal.Signals(signum).name)
                signal.signal(signum, handler)


# --------------------------------------------------------------------------------------------------------------
# The methods
# --------------------------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args, workdir: str):
        self.args = args
        self.workdir = workdir
        self.quiet = Quiet(os.path.join(workdir, "launcher_output.log"))
        self.signal_handlers_left: dict = {}  # method -> names of signal handlers it left installed
        self.accelerate = None
        self.accelerate_unavailable = None
        if args.skip_accelerate:
            self.accelerate_unavailable = "skipped (--skip-accelerate)"
        else:
            try:
                import accelerate

                self.accelerate = accelerate
            except Exception as exc:  # noqa: BLE001 - report why, do not crash
                self.accelerate_unavailable = f"import accelerate failed: {type(exc).__name__}: {exc}"
        self.disabled: dict = {}  # method -> why it is no longer run
        self.last_failure_events: list = []
        self.last_failure_phases: dict | None = None
        self.methods = ["ours", "bare"] + (["accelerate"] if self.accelerate else [])

    # one timed launch: returns (seconds or None, error text or None, extra)
    def launch(self, method: str, n: int):
        extra = {}
        error = None
        with Watchdog(LAUNCH_GUARD_S, before_kill=dump_stacks_of_descendants) as guard, self.quiet(), \
                restore_signal_handlers(self.signal_handlers_left, method):
            try:
                if method == "ours":
                    port = str(free_port())  # like the baselines: not the shared default 29500 (see README)
                    start = time.monotonic()
                    notebook_launcher(ours_noop, num_processes=n, start_method="fork", device="cpu", use_port=port)
                    elapsed = time.monotonic() - start
                    extra["phases"] = ours_phases(start, elapsed)
                elif method == "bare":
                    with master_env(free_port()):
                        start = time.monotonic()
                        torch_mp.start_processes(bare_noop, args=(n,), nprocs=n, start_method="fork", join=True)
                        elapsed = time.monotonic() - start
                else:
                    port = str(free_port())
                    start = time.monotonic()
                    self.accelerate.notebook_launcher(accelerate_noop, num_processes=n, use_port=port)
                    elapsed = time.monotonic() - start
            except BaseException as exc:  # noqa: BLE001
                if isinstance(exc, KeyboardInterrupt):
                    raise
                elapsed = None
                error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        if guard.fired:
            error = f"timed out after {LAUNCH_GUARD_S:.0f} s (workers killed by the benchmark's watchdog)"
        return elapsed, error, extra

    # one failure run: returns (seconds from rank 1's raise to the caught exception, blamed rank, error)
    def failure(self, method: str):
        if os.path.exists(STAMP_PATH):
            os.remove(STAMP_PATH)
        caught_at = None
        blamed = None
        error = None
        with Watchdog(FAILURE_GUARD_S, before_kill=dump_stacks_of_descendants) as guard, self.quiet(), \
                restore_signal_handlers(self.signal_handlers_left, method):
            try:
                if method == "ours":
                    notebook_launcher(ours_fail, num_processes=2, start_method="fork", device="cpu",
                                      use_port=str(free_port()))
                elif method == "bare":
                    with master_env(free_port()):
                        torch_mp.start_processes(bare_fail, args=(2,), nprocs=2, start_method="fork", join=True)
                else:
                    self.accelerate.notebook_launcher(accelerate_fail, num_processes=2, use_port=str(free_port()))
                error = "returned without raising"
            except RankFailedError as exc:
                caught_at = time.monotonic()
                blamed = exc.rank
                self.last_failure_events = list(exc.run.events)
            except torch_mp.ProcessRaisedException as exc:
                caught_at = time.monotonic()
                blamed = exc.error_index
            except torch_mp.ProcessExitedException as exc:
                caught_at = time.monotonic()
                blamed = exc.error_index
            except BaseException as exc:  # noqa: BLE001 - ChildFailedError (elastic) and anything unexpected
                if isinstance(exc, KeyboardInterrupt):
                    raise
                caught_at = time.monotonic()
                if hasattr(exc, "get_first_failure"):
                    blamed = exc.get_first_failure()[0]
                else:
                    error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        if guard.fired:
            return None, blamed, f"timed out after {FAILURE_GUARD_S:.0f} s (killed by the benchmark's watchdog)"
        try:
            with open(STAMP_PATH) as stamp:
                raised_at = float(stamp.read())
        except (OSError, ValueError):
            return None, blamed, error or "rank 1 never reached its raise (no timestamp)"
        if caught_at is None:
            return None, blamed, error
        if method == "ours":
            self.last_failure_phases = ours_failure_phases(self.last_failure_events, raised_at, caught_at)
        return caught_at - raised_at, blamed, error


def ours_phases(call_at: float, elapsed: float) -> dict | None:
    """Where our launch spent its time, from the run's own events (worker-side monotonic timestamps)."""
    run = last_run()
    if run is None:
        return None
    starting = [e.time for e in run.events if e.kind == "status" and e.data.get("state") == "starting"]
    running = [e.time for e in run.events if e.kind == "status" and e.data.get("state") == "running"]
    results = [e.time for e in run.events if e.kind == "result"]
    finished = [e.time for e in run.events if e.kind == "status" and e.data.get("state") == "finished"]
    exits = [e.time for e in run.events if e.kind == "exit"]
    if not (starting and running and finished and exits):
        return None
    return {
        "call_to_first_worker_up": min(starting) - call_at,  # plan, run log, fork of rank 0, worker setup
        "first_to_last_worker_up": max(starting) - min(starting),  # forks of the other ranks
        "last_worker_up_to_all_in_group": max(running) - max(starting),  # set_num_threads + init_process_group
        "all_in_group_to_all_finished": max(finished) - max(running),  # fn, result pickle, destroy_process_group
        "all_finished_to_all_reaped": max(exits) - max(finished),  # os._exit, pidfd wakeup, reap, pipe drain
        "all_reaped_to_return": call_at + elapsed - max(exits),  # close, summary file, return
        "result_events": len(results),
    }


def ours_failure_phases(events, raised_at: float, caught_at: float) -> dict | None:
    """Where our failure propagation spent its time: rank 1's failure event (sent by the worker), the moment
    the kernel read it (= SIGTERM to the others), the last worker reaped, the exception caught here."""
    failure = [e for e in events if e.kind == "failure" and e.rank == 1]
    exits = [e.time for e in events if e.kind == "exit"]
    rank1_exit = [e.time for e in events if e.kind == "exit" and e.rank == 1]
    rank0_exit = [e.time for e in events if e.kind == "exit" and e.rank == 0]
    if not (failure and exits and rank1_exit and rank0_exit):
        return None
    return {
        "raise_to_failure_event_sent": failure[0].time - raised_at,  # traceback formatting + one pipe write
        "failure_event_sent_to_rank1_reaped": rank1_exit[0] - failure[0].time,  # rank 1's own exit
        "failure_event_sent_to_rank0_reaped": rank0_exit[0] - failure[0].time,  # SIGTERM'd (or gloo error) + exit
        "last_reaped_to_caught": caught_at - max(exits),  # close, failure report, raise
    }


# --------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    global STAMP_PATH
    parser = arguments(__doc__, "launch_overhead")
    parser.add_argument("--reps", type=int, default=20, help="measured repetitions per method (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up repetitions, not counted (default 2)")
    parser.add_argument("--sizes", default="2,4", help="num_processes values for the launch overhead (default 2,4)")
    parser.add_argument("--failure-reps", type=int, default=None, help="failure repetitions (default: --reps)")
    parser.add_argument("--skip-accelerate", action="store_true", help="leave Accelerate out")
    args = parse(parser, argv, smoke={"reps": 1, "warmup": 0, "sizes": "2", "failure_reps": 1,
                                      "skip_accelerate": True})
    sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    failure_reps = args.reps if args.failure_reps is None else args.failure_reps

    workdir = tempfile.mkdtemp(prefix="nl_bench_")
    STAMP_PATH = os.path.join(workdir, "rank1_raised_at")
    saved_tempdir = tempfile.tempdir
    saved_runs_dir = os.environ.get("NOTEBOOK_LAUNCHER_RUNS_DIR")
    tempfile.tempdir = workdir  # torch elastic's per-launch log directories land here and go with it
    os.environ["NOTEBOOK_LAUNCHER_RUNS_DIR"] = os.path.join(workdir, "runs")
    bench = Bench(args, workdir)
    loadavg_at_start = os.getloadavg()
    started = time.monotonic()
    report = None
    try:
        report = run_all(bench, sizes, args.warmup, args.reps, failure_reps)
    finally:
        leftovers = kill_descendants()
        bench.quiet.close()
        log_path = os.path.join(workdir, "launcher_output.log")
        log_tail = _tail(log_path, 40)
        kept_log = os.path.join(os.path.dirname(os.path.abspath(args.output)), "launch_overhead.log")
        if report is None or report_has_errors(report):  # keep what the launchers printed, for diagnosis
            os.makedirs(os.path.dirname(kept_log), exist_ok=True)
            shutil.copyfile(log_path, kept_log)
        elif os.path.exists(kept_log):  # a stale log from an earlier run would mislead
            os.remove(kept_log)
        tempfile.tempdir = saved_tempdir
        if saved_runs_dir is None:
            os.environ.pop("NOTEBOOK_LAUNCHER_RUNS_DIR", None)
        else:
            os.environ["NOTEBOOK_LAUNCHER_RUNS_DIR"] = saved_runs_dir
        shutil.rmtree(workdir, ignore_errors=True)
    report["environment"]["loadavg_at_start"] = loadavg_at_start
    report["children_left_at_end"] = leftovers
    report["total_runtime_s"] = round(time.monotonic() - started, 2)
    if report_has_errors(report):
        report["launcher_output_tail"] = log_tail
        report["launcher_output_log"] = kept_log
    print_report(report)
    print(f"\ntotal runtime {report['total_runtime_s']:.1f} s   children left: {len(leftovers)}")
    return finish(args, report, report["ratios"], default=_json_default)


def report_has_errors(report) -> bool:
    return bool(report) and any(row.get("errors") for row in report["launch"] + report["failure"])


def run_all(bench: Bench, sizes, warmup: int, reps: int, failure_reps: int) -> dict:
    methods = bench.methods
    launch = {(m, n): {"samples": [], "warmup": [], "errors": [], "phases": []} for n in sizes for m in methods}
    failure = {m: {"samples": [], "warmup": [], "errors": [], "blamed_rank": [], "phases": []} for m in methods}

    # 1. launch overhead: interleaved, method order rotated each repetition
    total = warmup + reps
    for rep in range(total):
        order = methods[rep % len(methods):] + methods[:rep % len(methods)]
        for n in sizes:
            for method in order:
                cell = launch[(method, n)]
                if method in bench.disabled or cell.get("gave_up"):
                    continue
                elapsed, error, extra = bench.launch(method, n)
                if error:
                    cell["errors"].append(f"rep {rep}: {error}")
                    if sum("timed out" in e for e in cell["errors"]) >= MAX_TIMEOUTS:
                        cell["gave_up"] = f"not run after rep {rep}: it hung {MAX_TIMEOUTS} times"
                    if rep == 0 and method == "accelerate" and "timed out" not in error:  # refused: say why
                        bench.disabled[method] = f"accelerate.notebook_launcher refused or failed: {error}"
                        bench.accelerate_unavailable = bench.disabled[method]
                (cell["warmup"] if rep < warmup else cell["samples"]).append(elapsed)
                if rep >= warmup and extra.get("phases"):
                    cell["phases"].append(extra["phases"])
        log(f"  ... launch overhead: repetition {rep + 1}/{total} done", sys.stdout)

    # 2. failure propagation: interleaved the same way
    total = warmup + failure_reps
    for rep in range(total):
        order = methods[rep % len(methods):] + methods[:rep % len(methods)]
        for method in order:
            cell = failure[method]
            if method in bench.disabled or cell.get("gave_up"):
                continue
            seconds, blamed, error = bench.failure(method)
            if error:
                cell["errors"].append(f"rep {rep}: {error}")
                if sum("timed out" in e for e in cell["errors"]) >= MAX_TIMEOUTS:
                    cell["gave_up"] = f"not run after rep {rep}: it hung {MAX_TIMEOUTS} times"
                if rep == 0 and method == "accelerate" and seconds is None:
                    bench.disabled[method] = f"accelerate failure run did not complete: {error}"
                    bench.accelerate_unavailable = bench.disabled[method]
            (cell["warmup"] if rep < warmup else cell["samples"]).append(seconds)
            if rep >= warmup:
                cell["blamed_rank"].append(blamed)
                if method == "ours" and seconds is not None and bench.last_failure_phases:
                    cell["phases"].append(bench.last_failure_phases)
            bench.last_failure_phases = None
        log(f"  ... failure propagation: repetition {rep + 1}/{total} done", sys.stdout)

    return summarize(bench, sizes, launch, failure, warmup, reps, failure_reps)


def summarize(bench, sizes, launch, failure, warmup, reps, failure_reps) -> dict:
    launch_rows = []
    for n in sizes:
        for method in bench.methods:
            cell = launch[(method, n)]
            row = {"method": method, "num_processes": n, "median_s": median(cell["samples"]),
                   "min_s": min([s for s in cell["samples"] if s is not None], default=None),
                   "max_s": max([s for s in cell["samples"] if s is not None], default=None),
                   "first_warmup_s": cell["warmup"][0] if cell["warmup"] else None,
                   "slow_over_1s": sum(1 for x in cell["samples"] if x is not None and x > SLOW_S),
                   "samples_s": cell["samples"], "warmup_s": cell["warmup"], "errors": cell["errors"],
                   "gave_up": cell.get("gave_up")}
            if cell["phases"]:
                keys = [k for k in cell["phases"][0] if k != "result_events"]
                row["phases_median_s"] = {k: median([p[k] for p in cell["phases"]]) for k in keys}
                row["phases_s"] = cell["phases"]
            launch_rows.append(row)
    failure_rows = []
    for method in bench.methods:
        cell = failure[method]
        failure_rows.append({"method": method, "num_processes": 2, "median_s": median(cell["samples"]),
                             "min_s": min([s for s in cell["samples"] if s is not None], default=None),
                             "max_s": max([s for s in cell["samples"] if s is not None], default=None),
                             "samples_s": cell["samples"], "warmup_s": cell["warmup"], "errors": cell["errors"],
                             "blamed_rank": cell["blamed_rank"], "gave_up": cell.get("gave_up")})
        if cell["phases"]:
            failure_rows[-1]["phases_median_s"] = {k: median([p[k] for p in cell["phases"]]) for k in cell["phases"][0]}
            failure_rows[-1]["phases_s"] = cell["phases"]

    def med(rows, method, n=None):
        for row in rows:
            if row["method"] == method and (n is None or row["num_processes"] == n):
                return row["median_s"]
        return None

    ratios = {}
    aims = {}
    for n in sizes:
        ours, bare, acc = med(launch_rows, "ours", n), med(launch_rows, "bare", n), med(launch_rows, "accelerate", n)
        ratios[f"launch_N{n}_ours_over_bare"] = ratio(ours, bare)
        ratios[f"launch_N{n}_accelerate_over_ours"] = ratio(acc, ours)
        aims[f"launch_N{n}_ours_le_{AIM_OURS_OVER_BARE}x_bare"] = _aim(ratio(ours, bare), lambda r: r <= AIM_OURS_OVER_BARE)
        aims[f"launch_N{n}_accelerate_ge_{AIM_ACCELERATE_OVER_OURS}x_ours"] = _aim(
            ratio(acc, ours), lambda r: r >= AIM_ACCELERATE_OVER_OURS)
    ours, bare, acc = med(failure_rows, "ours"), med(failure_rows, "bare"), med(failure_rows, "accelerate")
    ratios["failure_ours_over_bare"] = ratio(ours, bare)
    ratios["failure_accelerate_over_ours"] = ratio(acc, ours)
    aims[f"failure_ours_le_{AIM_FAILURE_S * 1000:.0f}ms"] = _aim(ours, lambda s: s <= AIM_FAILURE_S)

    return {
        "benchmark": "launch_overhead",
        "settings": {"warmup": warmup, "reps": reps, "failure_reps": failure_reps, "sizes": sizes,
                     "methods": bench.methods, "rank1_delay_s": RANK1_DELAY_S,
                     "launch_guard_s": LAUNCH_GUARD_S, "failure_guard_s": FAILURE_GUARD_S},
        "environment": _environment(bench),
        "accelerate_unavailable": bench.accelerate_unavailable,
        "signal_handlers_left_installed": {m: sorted(names) for m, names in bench.signal_handlers_left.items()},
        "launch": launch_rows,
        "failure": failure_rows,
        "ratios": ratios,
        "aims": aims,
    }


def _aim(value, predicate):
    if value is None:
        return {"value": None, "met": None}
    return {"value": value, "met": bool(predicate(value))}


def _environment(bench) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "notebook_launcher": getattr(nl_pkg, "__version__", "?"),
           "cpus": len(os.sched_getaffinity(0)), "loadavg_at_end": os.getloadavg(), "platform": platform.platform()}
    if bench.accelerate is not None:
        env["accelerate"] = bench.accelerate.__version__
    return env


def print_report(report: dict) -> None:
    sizes = report["settings"]["sizes"]
    env = report["environment"]
    print()
    print(f"Launch overhead, call -> return, no-op fn with a gloo process group (median of {report['settings']['reps']}"
          f" interleaved reps after {report['settings']['warmup']} warm-ups; ms)")
    print(f"  torch {env['torch']}, accelerate {env.get('accelerate', '-')}, {env['cpus']} CPUs, "
          f"load average {env['loadavg_at_start'][0]:.2f} at start, {env['loadavg_at_end'][0]:.2f} at end")
    header = f"  {'method':<12}{'N':>3}{'median':>9}{'min':>8}{'max':>9}{'1st call':>10}  {'>1s':>3}  errors"
    print(header)
    for n in sizes:
        for row in report["launch"]:
            if row["num_processes"] != n:
                continue
            print(f"  {row['method']:<12}{n:>3}{ms(row['median_s'], 1):>9}{ms(row['min_s'], 1):>8}"
                  f"{ms(row['max_s'], 1):>9}{ms(row['first_warmup_s'], 1):>10}  {row['slow_over_1s']:>3}  "
                  f"{len(row['errors'])}")
    for n in sizes:
        r = report["ratios"]
        print(f"  N={n}: ours / bare = {fmt_ratio(r[f'launch_N{n}_ours_over_bare'])} (aim <= {AIM_OURS_OVER_BARE}x)"
              f"   accelerate / ours = {fmt_ratio(r[f'launch_N{n}_accelerate_over_ours'])}"
              f" (aim >= {AIM_ACCELERATE_OVER_OURS}x)")
    for row in report["launch"]:
        if row["method"] == "ours" and row.get("phases_median_s"):
            phases = ", ".join(f"{k} {v * 1000:.1f}" for k, v in row["phases_median_s"].items())
            print(f"  ours N={row['num_processes']} phases (median ms): {phases}")

    print()
    print(f"Failure propagation, N=2: rank 1 raises while rank 0 waits in all_reduce -> exception caught in the "
          f"caller (median of {report['settings']['failure_reps']}; ms)")
    print(f"  {'method':<12}{'median':>9}{'min':>8}{'max':>8}  blamed rank(s)    errors")
    for row in report["failure"]:
        blamed = sorted({str(b) for b in row["blamed_rank"]})
        print(f"  {row['method']:<12}{ms(row['median_s'], 1):>9}{ms(row['min_s'], 1):>8}{ms(row['max_s'], 1):>8}"
              f"  {','.join(blamed):<17} {len(row['errors'])}")
    for row in report["failure"]:
        if row.get("phases_median_s"):
            phases = ", ".join(f"{k} {v * 1000:.1f}" for k, v in row["phases_median_s"].items())
            print(f"  {row['method']} phases (median ms): {phases}")
    r = report["ratios"]
    print(f"  ours / bare = {fmt_ratio(r['failure_ours_over_bare'])}   accelerate / ours = "
          f"{fmt_ratio(r['failure_accelerate_over_ours'])}   (aim: ours <= {AIM_FAILURE_S * 1000:.0f} ms)")

    print()
    print("Aims:")
    for name, aim in report["aims"].items():
        verdict = "n/a" if aim["met"] is None else ("met" if aim["met"] else "NOT met")
        value = aim["value"]
        shown = "n/a" if value is None else (f"{value * 1000:.1f} ms" if name.startswith("failure") else f"{value:.2f}x")
        print(f"  {name:<40} {shown:>10}  {verdict}")
    if report.get("accelerate_unavailable"):
        print(f"\nAccelerate: {report['accelerate_unavailable']}")
    for method, names in report.get("signal_handlers_left_installed", {}).items():
        print(f"Note: {method} left its handlers for {', '.join(names)} installed in the calling process "
              f"(the benchmark restores them after each call)")
    for row in report["launch"] + report["failure"]:
        section = "launch" if row in report["launch"] else "failure"
        for error in row["errors"][:4]:
            print(f"  error [{section} {row['method']} N={row['num_processes']}] {error}")
        if row.get("gave_up"):
            print(f"  [{section} {row['method']} N={row['num_processes']}] {row['gave_up']}")
    if report.get("launcher_output_log"):
        print(f"  everything the launchers printed: {os.path.relpath(report['launcher_output_log'])}")


def _tail(path: str, lines: int) -> list[str]:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - 64 * 1024))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def _json_default(value):
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - never leave workers behind, even on a bug here
        kill_descendants()
        traceback.print_exc()
        sys.exit(1)
