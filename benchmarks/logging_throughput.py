"""Log lines and prints from workers against Python logging to a file, side by side, 2 ranks.

Run:  .venv/bin/python benchmarks/logging_throughput.py
      options: --lines 50000 --burst 2000 --reps 5 --kernel-reps 3 --skip-kernel

Every repetition runs each case once, in an order rotated from one repetition to the next, so that background
load hits ours and the baseline alike; the table gives medians over repetitions, with the spread (min-max).

1. Cost of one call, timed in each worker around a burst of ``--burst`` calls (after 200 warm-up calls; a burst
   fits in the rank's pipe, so this is the worker's own cost while the kernel collects), median over the 2 ranks:
   - ours: ``get_logger("bench").info("line %d of rank %d", i, rank, main_process_only=False)`` in a launched
     worker, and ``print("line %d of rank %d" % (i, rank))`` there;
   - baseline: a ``logging.FileHandler`` (one flush per record, as logging does) in each of 2 forked children,
     same message, format ``%(levelname)s %(name)s: %(message)s`` (what our display shows after the prefix).
   Aim: ours <= 0.8x the baseline.
2. Throughput, 2 ranks x ``--lines`` lines: ours launch -> return (the text display's stdout in a StringIO),
   against the 2 forked FileHandler children start -> join. Lost lines counted in ``last_run().events``, in the run
   log on disk and in the lines displayed (ours), in the files (baseline). Aim: ours at least as fast (>= 1.0x).
3. The same in a real kernel (jupyter_client, ipykernel) with the panel showing (``display="panel"``), execute ->
   idle, against the FileHandler children forked from a cell of the same kernel; ``--kernel-reps`` repetitions.
   Lines counted in the kernel's ``last_run()`` and in its run log. Aim: >= 1.0x.

The load average goes into the output and the JSON (benchmarks/results/logging_throughput.json, every sample).
Run logs go to a temporary directory, removed at the end; every launch has a timeout, every kernel is shut down,
and the script checks at the end that it has no child processes left.
"""

from __future__ import annotations

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
from common import HERE, KILL_WAIT_S, ROOT, Kernel, arguments, finish, kernel_env, kill_all, log, median, parse, table

import notebook_launcher as nl_pkg
from notebook_launcher import get_logger, last_run, notebook_launcher

NUM_RANKS = 2
WARMUP_CALLS = 200
LAUNCH_TIMEOUT_S = 120
CHILD_JOIN_S = 120
AIM_CALL_RATIO = 0.8  # ours per call / FileHandler per call, at most
AIM_THROUGHPUT_RATIO = 1.0  # ours lines/s / FileHandler lines/s, at least
MESSAGE = "line %d of rank %d"
FORMAT = "%(levelname)s %(name)s: %(message)s"
LOGGER_NAME = "bench"
LOG_LINE = re.compile(r"^\[rank (\d+)\] INFO bench: line \d+ of rank \1$", re.MULTILINE)
PRINT_LINE = re.compile(r"^\[rank (\d+)\] line \d+ of rank \1$", re.MULTILINE)


# -- on the ranks (module level: forked workers inherit them) ---------------------------------------------------
def log_lines(n: int, warmup: int) -> float:
    """``warmup`` untimed calls, then ``n`` timed ones; this rank's µs per call."""
    logger = get_logger(LOGGER_NAME, log_level="INFO")
    rank = int(os.environ["RANK"])
    for i in range(warmup):
        logger.info("warm-up %d of rank %d", i, rank, main_process_only=False)
    start = time.perf_counter()
    for i in range(n):
        logger.info(MESSAGE, i, rank, main_process_only=False)
    return (time.perf_counter() - start) / max(n, 1) * 1e6


def print_lines(n: int, warmup: int) -> float:
    rank = int(os.environ["RANK"])
    for i in range(warmup):
        print("warm-up %d of rank %d" % (i, rank))
    start = time.perf_counter()
    for i in range(n):
        print(MESSAGE % (i, rank))
    return (time.perf_counter() - start) / max(n, 1) * 1e6


def file_logger_child(path: str, n: int, warmup: int, index: int, results) -> None:
    """The baseline, in a forked child: a logger with one FileHandler, the same message and format as ours."""
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
    results.put((index, elapsed / max(n, 1) * 1e6))


# -- the cases ----------------------------------------------------------------------------------------------------
def lost(expected: int, counts: dict) -> int:
    return sum(max(0, expected - counts.get(rank, 0)) for rank in range(NUM_RANKS))


def run_log_lines(run_dir: str, kind: str) -> dict:
    """Lines per rank in the run log on disk (log records, or stream lines for prints)."""
    counts = Counter()
    with open(os.path.join(run_dir, "events.jsonl"), encoding="utf-8") as lines:
        for line in lines:
            if f'"kind":"{kind}"' not in line.replace(" ", ""):
                continue
            record = json.loads(line)
            if str(record["data"].get("message" if kind == "log" else "text", "")).startswith("line "):
                counts[record["rank"]] += 1
    return dict(counts)


def ours(kind: str, n: int, warmup: int) -> dict:
    """One launch of 2 ranks writing ``n`` lines each (``kind``: "log" or "print")."""
    function, pattern = (log_lines, LOG_LINE) if kind == "log" else (print_lines, PRINT_LINE)
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        start = time.perf_counter()
        notebook_launcher(function, args=(n, warmup), num_processes=NUM_RANKS, device="cpu", timeout=LAUNCH_TIMEOUT_S)
        wall = time.perf_counter() - start
    run = last_run()
    event_kind, field = ("log", "message") if kind == "log" else ("stream", "text")
    in_events = Counter(e.rank for e in run.events if e.kind == event_kind and str(e.data.get(field, "")).startswith("line "))
    shown = Counter(int(rank) for rank in pattern.findall(captured.getvalue()))
    on_disk = run_log_lines(run.run_dir, event_kind)
    return {"wall_s": wall, "lines_per_s": NUM_RANKS * n / wall, "us_per_call": median(run.results.values()),
            "lost": lost(n, in_events) + lost(n, shown) + lost(n, on_disk), "events_dropped": run.events_dropped}


def file_handler(directory: str, n: int, warmup: int, count: bool = True) -> dict:
    """The baseline: 2 forked children, each a FileHandler writing ``n`` lines (after ``warmup``)."""
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
    try:
        costs = dict(results.get(timeout=CHILD_JOIN_S) for _ in children)
        for child in children:
            child.join(CHILD_JOIN_S)
        wall = time.perf_counter() - start
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
                child.join(5)
        results.close()
    return {"wall_s": wall, "lines_per_s": NUM_RANKS * n / wall, "us_per_call": median(costs.values()),
            "lost": file_lines_lost(directory, n) if count else None}


def file_lines_lost(directory: str, n: int) -> int:
    counts = {}
    for index in range(NUM_RANKS):
        with open(os.path.join(directory, f"file_logger_{index}.log"), encoding="utf-8") as written:
            counts[index] = sum(1 for line in written if line.startswith("INFO bench.file") and ": line " in line)
    return lost(n, counts)


def interleaved(cases: dict, reps: int) -> dict:
    """Each case once per repetition, the order rotated each time; every sample kept."""
    samples = {name: [] for name in cases}
    names = list(cases)
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            samples[name].append(cases[name]())
        log(f"  rep {rep}: " + ", ".join(f"{name} {samples[name][-1]['us_per_call']:.2f} us "
                                         f"{samples[name][-1]['lines_per_s']:,.0f}/s" for name in names))
    return samples


# -- in a real kernel -----------------------------------------------------------------------------------------------
SETUP_CELL = f'''\
import json, logging, os, sys, time, warnings
import multiprocessing as mp
from collections import Counter
sys.path.insert(0, {ROOT!r})
sys.path.insert(0, {HERE!r})
import torch  # as in a training notebook
from notebook_launcher import last_run, notebook_launcher
from logging_throughput import log_lines, print_lines, file_handler, file_lines_lost, run_log_lines

def summary(n, kind):
    run = last_run()
    event_kind, field = ("log", "message") if kind == "log" else ("stream", "text")
    counts = Counter(e.rank for e in run.events if e.kind == event_kind and str(e.data.get(field, "")).startswith("line "))
    on_disk = run_log_lines(run.run_dir, event_kind)
    lost = sum(max(0, n - counts.get(r, 0)) + max(0, n - on_disk.get(r, 0)) for r in range(2))
    return {{"status": run.status, "lost": lost, "us_per_call": sorted(run.results.values())}}

for _display in ("panel", "text"):  # warm: imports, first fork, both displays
    notebook_launcher(log_lines, args=(10, 0), num_processes=2, device="cpu", display=_display)
None
'''
# the timed cells only launch; the lines are counted in the next cell, untimed (reading back 100,000 lines of
# the run log is the check, not the run)
OURS_CELL = ("notebook_launcher({function}, args=({n}, 0), num_processes=2, device='cpu', display='panel', "
             "timeout={timeout})", "RESULT = summary({n}, {kind!r})")
FILE_CELL = ("file_handler({directory!r}, {n}, 0, count=False)",
             "RESULT = {{'lost': file_lines_lost({directory!r}, {n})}}")


def bench_in_kernel(directory: str, n: int, reps: int) -> dict:
    kernel = Kernel(directory, kernel_env(directory), cell_timeout_s=LAUNCH_TIMEOUT_S)
    cells = {
        "ours log, panel": [cell.format(function="log_lines", n=n, kind="log", timeout=LAUNCH_TIMEOUT_S)
                            for cell in OURS_CELL],
        "ours print, panel": [cell.format(function="print_lines", n=n, kind="print", timeout=LAUNCH_TIMEOUT_S)
                              for cell in OURS_CELL],
        "FileHandler, forked from the kernel": [cell.format(directory=directory, n=n) for cell in FILE_CELL],
    }
    samples = {name: [] for name in cells}
    try:
        kernel.run(SETUP_CELL)
        names = list(cells)
        for rep in range(reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                timed, check = cells[name]
                cell = kernel.run(timed)
                kernel.run(check)
                result = json.loads(kernel.run("print(json.dumps(RESULT))")["stdout"])
                samples[name].append({"idle_s": cell["idle_s"], "lines_per_s": NUM_RANKS * n / cell["idle_s"],
                                      "lost": result["lost"], "status": result.get("status")})
            log(f"  kernel rep {rep}: " + ", ".join(f"{name} {samples[name][-1]['lines_per_s']:,.0f}/s"
                                                   for name in names))
    finally:
        samples["kernel_leftovers_killed"] = kernel.close()["killed"]
    return samples


# -- report -----------------------------------------------------------------------------------------------------------
def spread(values, digits=1) -> str:
    values = [v for v in values if v is not None]
    return f"{median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})" if values else "-"


def aim_line(name: str, value: float, aim: float, at_most: bool) -> str:
    met = value <= aim if at_most else value >= aim
    return f"{name:58s} {value:6.2f}x  aim {'<=' if at_most else '>='} {aim:g}x: {'met' if met else 'NOT met'}"


def main(argv=None) -> int:
    parser = arguments(__doc__, "logging_throughput")
    parser.add_argument("--lines", type=int, default=50_000, help="lines per rank for the throughput")
    parser.add_argument("--burst", type=int, default=2_000, help="timed calls per rank for the cost per call")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions, plain process")
    parser.add_argument("--kernel-reps", type=int, default=3, help="interleaved repetitions in the kernel")
    parser.add_argument("--skip-kernel", action="store_true", help="no jupyter kernel (3.)")
    options = parse(parser, argv, smoke={"lines": 500, "burst": 100, "reps": 1, "kernel_reps": 1})

    directory = tempfile.mkdtemp(prefix="nl-logging-bench-")
    os.environ["NOTEBOOK_LAUNCHER_RUNS_DIR"] = os.path.join(directory, "runs")
    os.environ.pop("ACCELERATE_LOG_LEVEL", None)
    started = time.monotonic()
    results = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                           "notebook_launcher": nl_pkg.__version__, "cpus": os.cpu_count()},
               "options": vars(options), "load_at_start": os.getloadavg()}
    burst, lines = options.burst, options.lines
    try:
        log("1. cost of one call (burst)")
        results["call"] = interleaved({
            "ours log": lambda: ours("log", burst, WARMUP_CALLS),
            "ours print": lambda: ours("print", burst, WARMUP_CALLS),
            "FileHandler": lambda: file_handler(directory, burst, WARMUP_CALLS),
        }, options.reps)
        log("2. throughput, launch -> return")
        results["throughput"] = interleaved({
            "ours log": lambda: ours("log", lines, 0),
            "ours print": lambda: ours("print", lines, 0),
            "FileHandler": lambda: file_handler(directory, lines, 0),
        }, options.reps)
        if not options.skip_kernel:
            log("3. in a real kernel, the panel showing")
            results["kernel"] = bench_in_kernel(directory, lines, options.kernel_reps)
    finally:
        leftovers = kill_all(psutil.Process().children(recursive=True), wait_s=KILL_WAIT_S)
        shutil.rmtree(directory, ignore_errors=True)
    results["load_at_end"] = os.getloadavg()
    results["leftover_children_killed"] = leftovers
    results["total_s"] = time.monotonic() - started

    call, flood = results["call"], results["throughput"]
    us = {name: [s["us_per_call"] for s in samples] for name, samples in call.items()}
    rate = {name: [s["lines_per_s"] for s in samples] for name, samples in flood.items()}
    rows = [(f"per call, burst of {burst:,}: {name}", spread(us[name], 2) + " us", "-",
             sum(s["lost"] for s in call[name])) for name in call]
    rows += [(f"2 x {lines:,} lines, launch/start -> return/join: {name}", spread([s["us_per_call"] for s in
              flood[name]], 2) + " us", spread(rate[name], 0), sum(s["lost"] for s in flood[name])) for name in flood]
    ratios = {
        "per call: ours log / FileHandler": median(us["ours log"]) / median(us["FileHandler"]),
        "per call: ours print / FileHandler": median(us["ours print"]) / median(us["FileHandler"]),
        "lines/s: ours log / FileHandler": median(rate["ours log"]) / median(rate["FileHandler"]),
        "lines/s: ours print / FileHandler": median(rate["ours print"]) / median(rate["FileHandler"]),
    }
    aims = [aim_line(name, value, AIM_CALL_RATIO if name.startswith("per call") else AIM_THROUGHPUT_RATIO,
                     name.startswith("per call")) for name, value in ratios.items()]
    kernel = results.get("kernel")
    if kernel:
        cases = [name for name in kernel if name != "kernel_leftovers_killed"]
        krate = {name: [s["lines_per_s"] for s in kernel[name]] for name in cases}
        rows += [(f"in a kernel, execute -> idle: {name}", "-", spread(krate[name], 0),
                  sum(s["lost"] for s in kernel[name])) for name in cases]
        for name in ("ours log, panel", "ours print, panel"):
            ratios[f"kernel lines/s: {name} / FileHandler"] = median(krate[name]) / median(
                krate["FileHandler, forked from the kernel"])
            aims.append(aim_line(f"kernel lines/s: {name} / FileHandler", ratios[f"kernel lines/s: {name} / FileHandler"],
                                 AIM_THROUGHPUT_RATIO, False))
    total_lost = sum(row[3] for row in rows)
    results["ratios"], results["lost"] = ratios, total_lost
    print(table(("what (2 ranks; median (min-max) of interleaved reps)", "us per call", "lines/s", "lost"), rows))
    print()
    print("\n".join(aims))
    print(f"{'lines lost (run log, display, last_run().events, files)':58s} {total_lost:6d}   aim 0: "
          f"{'met' if total_lost == 0 else 'NOT met'}")
    print(f"load average at start {results['load_at_start'][0]:.2f}, at end {results['load_at_end'][0]:.2f}; "
          f"{options.reps} reps ({options.kernel_reps} in the kernel); total {results['total_s']:.0f} s")
    if leftovers:
        print(f"warning: had to kill leftover child processes {leftovers}")
    return finish(options, results, ratios)


if __name__ == "__main__":
    sys.exit(main())
