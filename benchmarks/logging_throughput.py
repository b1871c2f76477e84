"""Logging from workers: get_logger (a "log" event per record) vs. print from a forked child vs. a FileHandler.

Run:  .venv/bin/python benchmarks/logging_throughput.py
      options: --lines 100000 --kernel-lines 20000 --print-lines 2000 --burst 2000 --reps 10

Everything below runs with 2 ranks (2 worker processes at the same time), side by side in this one run:

a. ours, get_logger: ``logger.info("line %d of rank %d", i, rank, main_process_only=False)`` in each worker.
   - cost of one call, timed in the worker with time.perf_counter around a loop of ``--burst`` calls (after 200
     warm-up calls), median over ranks and ``--reps`` launches. A burst fits in the rank's pipe, so this is the
     worker's own cost while the kernel collects;
   - throughput, 2 ranks x ``--lines`` lines, launch -> return, in this plain python process. The count is
     checked three ways: log events per rank in ``last_run().events``, in the run log on disk (events.jsonl),
     and lines per rank the display wrote. The display's stdout goes to a StringIO (contextlib.redirect_stdout)
     while timing. The worker-side cost per call over this long loop is reported too: it includes waiting on a
     full pipe when the kernel falls behind (backpressure, not loss);
   - throughput inside a real kernel (jupyter_client, ipykernel): a cell launching 2 ranks x ``--kernel-lines``
     lines, timed from execute to the execute reply and to the kernel going idle (every output sent); the lines
     that arrived on IOPub are counted per rank, and ``last_run()`` in the kernel is counted too;
   - (for comparison with b.) ``print`` in a launched worker inside the kernel, 2 x ``--print-lines``.
b. baseline 1, print from a forked child inside a real kernel: a cell starts 2 ``multiprocessing`` processes
   (fork context), each prints ``--print-lines`` lines; per-print cost timed in the child, lines that arrived on
   IOPub counted (ipykernel 7 sends a forked child's prints over a zmq connection of its own).
c. baseline 2, Python logging to a file (logging.FileHandler, one flush per record) in 2 forked children of this
   process, same message and format: cost per call over ``--burst`` and over ``--lines`` calls, lines/s.

Aims reported against: ours <= 20 us per call, 0 lines lost.

Run logs go to a temporary directory (removed at the end). Every launch has a timeout, every kernel is shut down
and checked gone, every multiprocessing child is joined with a timeout and killed if needed, and the script
checks at the end that it has no child processes left. Results: a table on stdout and
benchmarks/results/logging_throughput.json (raw samples, medians, counts, ratios, aims).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import multiprocessing
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter

import psutil
import torch
from common import (
    HERE,
    KILL_WAIT_S,
    ROOT,
    Kernel,
    kernel_env,
    kill_all,
    log,
    median,
    table,
    write_json,
)

import notebook_launcher as nl_pkg
from notebook_launcher import get_logger, last_run, notebook_launcher

RESULTS_PATH = os.path.join(HERE, "results", "logging_throughput.json")
NUM_RANKS = 2
WARMUP_CALLS = 200
LAUNCH_TIMEOUT_S = 120  # notebook_launcher(timeout=...): a hung launch is stopped, never waited on forever
CELL_TIMEOUT_S = 120
CHILD_JOIN_S = 120
AIM_US_PER_CALL = 20.0
AIM_LOST = 0
MESSAGE = "line %d of rank %d"
FORMAT = "%(levelname)s %(name)s: %(message)s"  # what our display shows after the rank prefix
LOGGER_NAME = "bench"
LINE_RE = re.compile(r"^\[rank (\d+)\] INFO bench: line (\d+) of rank (\d+)$", re.MULTILINE)


# --------------------------------------------------------------------------------------------------------------
# Run on the ranks (module level: forked workers inherit them)
# --------------------------------------------------------------------------------------------------------------
def log_lines(n: int, warmup: int) -> dict:
    """``warmup`` untimed calls, then ``n`` timed ones; returns this rank's cost per call in µs."""
    logger = get_logger(LOGGER_NAME, log_level="INFO")
    rank = int(os.environ["RANK"])
    for i in range(warmup):
        logger.info("warm-up %d of rank %d", i, rank, main_process_only=False)
    start = time.perf_counter()
    for i in range(n):
        logger.info(MESSAGE, i, rank, main_process_only=False)
    elapsed = time.perf_counter() - start
    return {"rank": rank, "us_per_call": elapsed / n * 1e6 if n else 0.0}


def file_logger_child(path: str, n: int, warmup: int, index: int, results) -> None:
    """Baseline 2, in a forked child: a logger with one FileHandler, the same message and format as ours."""
    logger = logging.getLogger(f"{LOGGER_NAME}.file{index}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    for i in range(warmup):
        logger.info("warm-up %d of rank %d", i, index)
    start = time.perf_counter()
    for i in range(n):
        logger.info(MESSAGE, i, index)
    elapsed = time.perf_counter() - start
    handler.close()
    results.put((index, elapsed / n * 1e6))


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------
def log_events_per_rank(run) -> dict:
    """Timed log events ("line ..." messages) per rank in run.events."""
    counts = Counter(e.rank for e in run.events if e.kind == "log" and e.data.get("message", "").startswith("line "))
    return {rank: counts.get(rank, 0) for rank in range(NUM_RANKS)}


def run_log_events_per_rank(run_dir: str) -> dict:
    counts = Counter()
    with open(os.path.join(run_dir, "events.jsonl"), encoding="utf-8") as lines:
        for line in lines:
            if '"kind":"log"' not in line.replace(" ", ""):
                continue
            record = json.loads(line)
            if str(record["data"].get("message", "")).startswith("line "):
                counts[record["rank"]] += 1
    return {rank: counts.get(rank, 0) for rank in range(NUM_RANKS)}


def display_lines_per_rank(text: str) -> dict:
    counts = Counter(int(rank) for rank, _, _ in LINE_RE.findall(text))
    return {rank: counts.get(rank, 0) for rank in range(NUM_RANKS)}


def lost(expected: int, counts: dict) -> int:
    return sum(max(0, expected - counts.get(rank, 0)) for rank in range(NUM_RANKS))


def launch_quietly(function, args):
    """One launch with the display's stdout captured in a StringIO; returns (seconds, captured text, run)."""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        start = time.perf_counter()
        notebook_launcher(function, args=args, num_processes=NUM_RANKS, device="cpu", timeout=LAUNCH_TIMEOUT_S)
        elapsed = time.perf_counter() - start
    return elapsed, captured.getvalue(), last_run()


# --------------------------------------------------------------------------------------------------------------
# a. ours, in this plain python process
# --------------------------------------------------------------------------------------------------------------
def bench_ours_in_process(burst: int, lines: int, reps: int) -> dict:
    burst_samples, burst_counts, burst_walls = [], [], []
    for rep in range(reps):
        wall, text, run = launch_quietly(log_lines, (burst, WARMUP_CALLS))
        burst_samples += [run.results[rank]["us_per_call"] for rank in range(NUM_RANKS)]
        burst_walls.append(wall)
        burst_counts.append({"events": log_events_per_rank(run), "display": display_lines_per_rank(text),
                             "events_dropped": run.events_dropped})
        log(f"  ours burst rep {rep}: {[round(run.results[r]['us_per_call'], 2) for r in range(NUM_RANKS)]} us/call")

    wall, text, run = launch_quietly(log_lines, (lines, 0))
    events = log_events_per_rank(run)
    on_disk = run_log_events_per_rank(run.run_dir)
    shown = display_lines_per_rank(text)
    flood = {
        "lines_per_rank": lines,
        "wall_s": wall,
        "lines_per_s": NUM_RANKS * lines / wall,
        "us_per_call_by_rank": [run.results[rank]["us_per_call"] for rank in range(NUM_RANKS)],
        "log_events_in_last_run_events": events,
        "events_dropped": run.events_dropped,
        "total_events_in_last_run_events": len(run.events),
        "log_events_in_run_log": on_disk,
        "display_lines": shown,
        "lost_last_run_events": lost(lines, events),
        "lost_run_log": lost(lines, on_disk),
        "lost_display": lost(lines, shown),
        "status": run.status,
    }
    log(f"  ours flood: {wall:.2f} s, {flood['lines_per_s']:.0f} lines/s, events {events} "
        f"(dropped {run.events_dropped}), run log {on_disk}, display {shown}")
    return {
        "burst": {"calls_per_rank": burst, "warmup_calls": WARMUP_CALLS, "reps": reps,
                  "us_per_call_samples": burst_samples, "us_per_call_median": median(burst_samples),
                  "wall_s": burst_walls, "counts": burst_counts,
                  "lost": sum(lost(burst, c["events"]) + lost(burst, c["display"]) for c in burst_counts)},
        "flood": flood,
    }


# --------------------------------------------------------------------------------------------------------------
# c. baseline 2: logging.FileHandler in forked children of this process
# --------------------------------------------------------------------------------------------------------------
def run_file_children(directory: str, n: int, warmup: int) -> dict:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    paths = [os.path.join(directory, f"file_logger_{index}.log") for index in range(NUM_RANKS)]
    with warnings.catch_warnings():  # 3.12+: "fork() may lead to deadlocks" in a process with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        children = [context.Process(target=file_logger_child, args=(paths[i], n, warmup, i, results))
                    for i in range(NUM_RANKS)]
        start = time.perf_counter()
        for child in children:
            child.start()
    costs = {}
    try:
        for _ in children:
            index, us = results.get(timeout=CHILD_JOIN_S)
            costs[index] = us
        for child in children:
            child.join(CHILD_JOIN_S)
        wall = time.perf_counter() - start
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join(5)
        results.close()
    counts = {}
    for index, path in enumerate(paths):
        with open(path, encoding="utf-8") as written:
            counts[index] = sum(1 for line in written if line.startswith("INFO bench.file") and " line " in line)
    return {"us_per_call_by_child": [costs[i] for i in range(NUM_RANKS)], "wall_s": wall,
            "lines_per_s": NUM_RANKS * (n + warmup) / wall, "lines_in_files": counts, "lost": lost(n, counts),
            "exit_codes": [child.exitcode for child in children]}


def bench_file_handler(directory: str, burst: int, lines: int, reps: int) -> dict:
    burst_runs = []
    for rep in range(reps):
        burst_runs.append(run_file_children(directory, burst, WARMUP_CALLS))
        log(f"  FileHandler burst rep {rep}: {[round(x, 2) for x in burst_runs[-1]['us_per_call_by_child']]} us/call")
    flood = run_file_children(directory, lines, 0)
    log(f"  FileHandler flood: {flood['wall_s']:.2f} s, {flood['lines_per_s']:.0f} lines/s")
    samples = [us for run in burst_runs for us in run["us_per_call_by_child"]]
    return {"burst": {"calls_per_rank": burst, "reps": reps, "us_per_call_samples": samples,
                      "us_per_call_median": median(samples), "lost": sum(run["lost"] for run in burst_runs)},
            "flood": {**flood, "lines_per_rank": lines, "lines_per_s": NUM_RANKS * lines / flood["wall_s"]}}


# --------------------------------------------------------------------------------------------------------------
# In a real kernel (jupyter_client): a. ours, and b. baseline 1 (print from a forked multiprocessing child)
# --------------------------------------------------------------------------------------------------------------
SETUP_CELL = f'''\
import json, os, sys, time
import multiprocessing as mp
from collections import Counter
sys.path.insert(0, {ROOT!r})
import torch  # as in a training notebook; without it every forked worker imports torch itself (~1 s a launch)
from notebook_launcher import get_logger, last_run, notebook_launcher

def log_lines(n):
    logger = get_logger("bench", log_level="INFO")
    rank = int(os.environ["RANK"])
    start = time.perf_counter()
    for i in range(n):
        logger.info("line %d of rank %d", i, rank, main_process_only=False)
    return {{"rank": rank, "us_per_call": (time.perf_counter() - start) / max(n, 1) * 1e6}}

def print_lines(n):
    rank = int(os.environ["RANK"])
    start = time.perf_counter()
    for i in range(n):
        print("line %d of rank %d" % (i, rank))
    return {{"rank": rank, "us_per_call": (time.perf_counter() - start) / max(n, 1) * 1e6}}

def mp_printer(n, index, results):
    start = time.perf_counter()
    for i in range(n):
        print("baseline line %d of child %d" % (i, index))
    results.put((index, (time.perf_counter() - start) / max(n, 1) * 1e6))

def run_summary():
    run = last_run()
    logs = Counter(e.rank for e in run.events if e.kind == "log" and e.data.get("message", "").startswith("line "))
    streams = Counter(e.rank for e in run.events if e.kind == "stream" and e.data.get("text", "").startswith("line "))
    return {{"status": run.status, "events_dropped": run.events_dropped, "log_events": dict(logs),
             "stream_events": dict(streams), "duration_s": run.duration,
             "us_per_call_by_rank": [run.results[r]["us_per_call"] for r in sorted(run.results)]}}

notebook_launcher(log_lines, args=(10,), num_processes=2, device="cpu", display="text")  # warm: imports, first fork
None
'''

# display="text": this benchmark counts the lines the text display writes (the panel's cost is panel_overhead.py)
LAUNCH_LOG_CELL = ("notebook_launcher(log_lines, args=({n},), num_processes=2, device='cpu', display='text', "
                   "timeout={timeout});")
LAUNCH_PRINT_CELL = ("notebook_launcher(print_lines, args=({n},), num_processes=2, device='cpu', display='text', "
                     "timeout={timeout});")
SUMMARY_CELL = "print(json.dumps(run_summary()))"

MP_PRINT_CELL = '''\
import warnings
_context = mp.get_context("fork")
_results = _context.Queue()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    _children = [_context.Process(target=mp_printer, args=({n}, index, _results)) for index in range(2)]
    _start = time.perf_counter()
    for _child in _children:
        _child.start()
try:
    _costs = dict(_results.get(timeout={timeout}) for _ in _children)
    for _child in _children:
        _child.join({timeout})
    _wall = time.perf_counter() - _start
finally:
    for _child in _children:
        if _child.is_alive():
            _child.kill()
            _child.join(5)
MP_RESULT = {{"us_per_call_by_child": [_costs[i] for i in range(2)], "wall_s": _wall,
             "exit_codes": [c.exitcode for c in _children]}}
'''


def stream_messages(cell: dict) -> int:
    """How many stream messages the cell's output came in."""
    return sum(1 for output in cell["outputs"] if output["msg_type"] == "stream")


def count_baseline_lines(text: str, n: int) -> dict:
    """Lines of baseline 1 that arrived: each (child, i) found anywhere, and how many arrived as whole lines."""
    found = {(int(child), int(i)) for i, child in re.findall(r"baseline line (\d+) of child (\d+)", text)}
    whole = len(re.findall(r"^baseline line \d+ of child \d+$", text, re.MULTILINE))
    per_child = Counter(child for child, _ in found)
    return {"arrived": {child: per_child.get(child, 0) for child in range(NUM_RANKS)}, "whole_lines": whole,
            "lost": lost(n, per_child)}


def bench_in_kernel(directory: str, kernel_lines: int, print_lines: int) -> dict:
    kernel = Kernel(directory, kernel_env(directory), cell_timeout_s=CELL_TIMEOUT_S)
    results: dict = {}
    try:
        kernel.run(SETUP_CELL)

        cell = kernel.run(LAUNCH_LOG_CELL.format(n=kernel_lines, timeout=LAUNCH_TIMEOUT_S))
        summary = json.loads(kernel.run(SUMMARY_CELL)["stdout"])
        arrived = display_lines_per_rank(cell["stdout"])
        in_kernel = {int(rank): count for rank, count in summary["log_events"].items()}
        results["ours_log"] = {
            "lines_per_rank": kernel_lines, "execute_to_reply_s": cell["reply_s"], "execute_to_idle_s": cell["idle_s"],
            "lines_per_s_to_reply": NUM_RANKS * kernel_lines / cell["reply_s"],
            "lines_per_s_to_idle": NUM_RANKS * kernel_lines / cell["idle_s"],
            "us_per_call_by_rank": summary["us_per_call_by_rank"], "iopub_lines": arrived,
            "iopub_stream_messages": stream_messages(cell), "last_run_log_events": in_kernel,
            "events_dropped": summary["events_dropped"], "launch_duration_s": summary["duration_s"],
            "lost_iopub": lost(kernel_lines, arrived), "lost_last_run": lost(kernel_lines, in_kernel),
        }
        log(f"  ours in kernel: reply {cell['reply_s']:.2f} s, idle {cell['idle_s']:.2f} s, IOPub {arrived}, "
            f"last_run {in_kernel}")

        cell = kernel.run(LAUNCH_PRINT_CELL.format(n=print_lines, timeout=LAUNCH_TIMEOUT_S))
        summary = json.loads(kernel.run(SUMMARY_CELL)["stdout"])
        arrived = Counter(int(rank) for rank in re.findall(r"^\[rank (\d)\] line \d+ of rank \1$", cell["stdout"],
                                                           re.MULTILINE))
        results["ours_print"] = {
            "lines_per_rank": print_lines, "execute_to_reply_s": cell["reply_s"], "execute_to_idle_s": cell["idle_s"],
            "lines_per_s_to_idle": NUM_RANKS * print_lines / cell["idle_s"],
            "us_per_call_by_rank": summary["us_per_call_by_rank"],
            "iopub_lines": {rank: arrived.get(rank, 0) for rank in range(NUM_RANKS)},
            "lost_iopub": lost(print_lines, arrived),
        }
        log(f"  ours print in kernel: idle {cell['idle_s']:.2f} s, IOPub {dict(arrived)}")

        cell = kernel.run(MP_PRINT_CELL.format(n=print_lines, timeout=CHILD_JOIN_S))
        child = json.loads(kernel.run("print(json.dumps(MP_RESULT))")["stdout"])
        counted = count_baseline_lines(cell["stdout"], print_lines)
        results["mp_print"] = {
            "lines_per_child": print_lines, "execute_to_reply_s": cell["reply_s"], "execute_to_idle_s": cell["idle_s"],
            "lines_per_s_to_idle": NUM_RANKS * print_lines / cell["idle_s"],
            "us_per_call_by_child": child["us_per_call_by_child"], "children_wall_s": child["wall_s"],
            "exit_codes": child["exit_codes"], "iopub_stream_messages": stream_messages(cell),
            "iopub_lines": counted["arrived"], "whole_lines": counted["whole_lines"], "lost_iopub": counted["lost"],
        }
        log(f"  mp print in kernel: idle {cell['idle_s']:.2f} s, {child['us_per_call_by_child']} us/print, "
            f"IOPub {counted}")
    finally:
        results["kernel_leftovers_killed"] = kernel.close()["killed"]
    return results


# --------------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------------
def fmt(value, digits=1):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


TABLE_HEADER = ("what (2 ranks)", "lines/rank", "us per call", "lines/s", "lost")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=100_000, help="lines per rank, plain-process throughput")
    parser.add_argument("--kernel-lines", type=int, default=20_000, help="lines per rank, in-kernel throughput")
    parser.add_argument("--print-lines", type=int, default=2_000, help="prints per child, baseline 1")
    parser.add_argument("--burst", type=int, default=2_000, help="timed calls per rank for the cost per call")
    parser.add_argument("--reps", type=int, default=10, help="launches for the cost per call")
    parser.add_argument("--skip-kernel", action="store_true", help="no jupyter kernel (a. in-kernel and b.)")
    options = parser.parse_args()

    directory = tempfile.mkdtemp(prefix="nl-logging-bench-")
    os.environ["NOTEBOOK_LAUNCHER_RUNS_DIR"] = os.path.join(directory, "runs")
    os.environ.pop("ACCELERATE_LOG_LEVEL", None)
    started = time.monotonic()
    results = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "notebook_launcher": nl_pkg.__version__, "cpus": os.cpu_count(), "platform": platform.platform()},
        "options": vars(options), "aims": {"us_per_call_max": AIM_US_PER_CALL, "lost": AIM_LOST},
    }
    try:
        import ipykernel

        results["machine"]["ipykernel"] = ipykernel.__version__
        log("a. ours, plain python process")
        results["ours"] = bench_ours_in_process(options.burst, options.lines, options.reps)
        log("c. baseline 2: logging.FileHandler in forked children")
        results["file_handler"] = bench_file_handler(directory, options.burst, options.lines, options.reps)
        if not options.skip_kernel:
            log("a./b. in a real kernel")
            results["kernel"] = bench_in_kernel(directory, options.kernel_lines, options.print_lines)
    finally:
        leftovers = kill_all(psutil.Process().children(recursive=True), wait_s=KILL_WAIT_S)
        shutil.rmtree(directory, ignore_errors=True)
    results["leftover_children_killed"] = leftovers
    results["total_s"] = time.monotonic() - started

    ours, file_handler = results["ours"], results["file_handler"]
    flood = ours["flood"]
    rows = [
        ("ours get_logger, plain process, burst (median)", f"{options.burst:,}",
         fmt(ours["burst"]["us_per_call_median"], 2), "-", ours["burst"]["lost"]),
        ("ours get_logger, plain process, launch->return", f"{options.lines:,}",
         fmt(median(flood["us_per_call_by_rank"]), 2), fmt(flood["lines_per_s"], 0),
         (f"{flood['lost_run_log']} run log / {flood['lost_display']} display / "
          f"{flood['lost_last_run_events']} last_run().events")),
        ("baseline 2: FileHandler, forked, burst (median)", f"{options.burst:,}",
         fmt(file_handler["burst"]["us_per_call_median"], 2), "-", file_handler["burst"]["lost"]),
        ("baseline 2: FileHandler, forked, start->join", f"{options.lines:,}",
         fmt(median(file_handler["flood"]["us_per_call_by_child"]), 2), fmt(file_handler["flood"]["lines_per_s"], 0),
         file_handler["flood"]["lost"]),
    ]
    ratios = {
        "ours_burst_over_file_handler_burst": ours["burst"]["us_per_call_median"]
        / file_handler["burst"]["us_per_call_median"],
        "ours_lines_per_s_over_file_handler": flood["lines_per_s"] / file_handler["flood"]["lines_per_s"],
    }
    kernel = results.get("kernel")
    if kernel:
        ours_log, ours_print, mp_print = kernel["ours_log"], kernel["ours_print"], kernel["mp_print"]
        rows += [
            ("ours get_logger, in kernel, execute->reply", f"{options.kernel_lines:,}",
             fmt(median(ours_log["us_per_call_by_rank"]), 2), fmt(ours_log["lines_per_s_to_reply"], 0),
             f"{ours_log['lost_iopub']} IOPub / {ours_log['lost_last_run']} last_run()"),
            ("ours get_logger, in kernel, execute->idle", f"{options.kernel_lines:,}", "", 
             fmt(ours_log["lines_per_s_to_idle"], 0), ""),
            ("ours print(), launched worker, in kernel (->idle)", f"{options.print_lines:,}",
             fmt(median(ours_print["us_per_call_by_rank"]), 2), fmt(ours_print["lines_per_s_to_idle"], 0),
             f"{ours_print['lost_iopub']} IOPub"),
            ("baseline 1: print(), mp fork child, in kernel (->idle)", f"{options.print_lines:,}",
             fmt(median(mp_print["us_per_call_by_child"]), 2), fmt(mp_print["lines_per_s_to_idle"], 0),
             f"{mp_print['lost_iopub']} IOPub ({mp_print['whole_lines']:,} whole lines)"),
        ]
        ratios.update({
            "mp_print_us_over_ours_burst_us": median(mp_print["us_per_call_by_child"])
            / ours["burst"]["us_per_call_median"],
            "mp_print_us_over_ours_print_us": median(mp_print["us_per_call_by_child"])
            / median(ours_print["us_per_call_by_rank"]),
            "ours_kernel_lines_per_s_over_mp_print": ours_log["lines_per_s_to_idle"] / mp_print["lines_per_s_to_idle"],
        })
    lost_delivered = ours["burst"]["lost"] + flood["lost_run_log"] + flood["lost_display"]
    if kernel:
        lost_delivered += kernel["ours_log"]["lost_iopub"] + kernel["ours_log"]["lost_last_run"]
    lost_in_memory = flood["lost_last_run_events"]
    results["ratios"] = ratios
    results["aims_met"] = {"us_per_call": ours["burst"]["us_per_call_median"] <= AIM_US_PER_CALL,
                           "lost_delivered": lost_delivered == AIM_LOST,
                           "lost_last_run_events": lost_in_memory == AIM_LOST}

    print(table(TABLE_HEADER, rows))
    print()
    for name, value in ratios.items():
        print(f"{name:45s} {value:8.2f}x")
    met = {True: "met", False: "NOT met"}
    print(f"\naim: ours <= {AIM_US_PER_CALL:g} us per call: {met[results['aims_met']['us_per_call']]} "
          f"({fmt(ours['burst']['us_per_call_median'], 2)} us)")
    print(f"aim: 0 lines lost on the way (run log, display, IOPub, last_run() in the kernel): "
          f"{met[results['aims_met']['lost_delivered']]} ({lost_delivered} lost)")
    print(f"in memory: last_run().events holds {options.lines:,} lines per rank minus {lost_in_memory} "
          f"(it keeps at most 200,000 output/log lines by design)")
    if flood["events_dropped"]:
        print(f"note: last_run().events kept {flood['total_events_in_last_run_events']:,} events and dropped "
              f"{flood['events_dropped']:,} (its in-memory cap); the run log on disk has every one")
    if leftovers:
        print(f"warning: had to kill leftover child processes {leftovers}")
    print(f"total {results['total_s']:.0f} s")
    write_json(RESULTS_PATH, results)
    print(f"wrote {os.path.relpath(RESULTS_PATH, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
