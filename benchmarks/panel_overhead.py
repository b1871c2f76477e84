"""The live run panel's cost: display="panel" vs. display="text" in a real kernel, and the panel's parts in-process.

Run:  .venv/bin/python benchmarks/panel_overhead.py
      options: --lines 2000,20000 --reps 5 --quiet-s 5 --micro-events 100000 --micro-reps 7 --bundle-reps 20
               --skip-kernel --profile

Side by side in this one run:

1. In a real kernel (jupyter_client's KernelManager, ipykernel; NOTEBOOK_LAUNCHER_RUNS_DIR is a temporary
   directory removed at the end): a cell launching 2 CPU ranks that each print L lines (``--lines``, default
   2,000 and 20,000) and call ``report(step=..., total=L, loss=...)`` every 10 lines, with
   ``display="panel"`` and, as the baseline, ``display="text"``. Repetitions are interleaved (``--reps``): each
   repetition runs every (L, display) once, in an order rotated from one repetition to the next, so background
   load and drift hit both displays alike. Per cell:
   - seconds from execute to the execute reply and to the kernel going idle (every output sent), and the
     launch's own duration (``last_run().duration``);
   - the IOPub output messages of the cell (stream / display_data / update_display_data), counted by type,
     and their total JSON bytes (``len(json.dumps(content))`` per message);
   - panel: the final state as the frontend got it (the last display message's
     ``application/vnd.notebook-launcher.run.v1+json``): per rank ``lines``, ``lines_total`` and
     ``lines_dropped``. Nothing may be lost in the count: ``lines_total`` == L + every other output line the
     rank produced (its stream/log events in ``last_run().events`` that are not the L lines, normally 0), and
     ``lines_dropped`` == ``lines_total`` - ``len(lines)``;
   - text: the L lines of each rank that arrived on IOPub (the baseline's own "nothing lost" check).
   Reported as medians and ratios panel / text. A third case, the smallest L followed by ``--quiet-s`` seconds
   in which the ranks print nothing (a long step, an evaluation), shows what each display sends while nothing
   happens: the panel re-publishes its whole bundle once a second so that the elapsed time moves; the text
   display sends nothing. Counted from each output message's arrival time: the messages that arrive between the
   end of the same run without the quiet stretch (+0.3 s) and the end of the stretch, per second.
   ``--profile`` adds a cProfile of the launching cell (the thread that runs the
   display) for one panel and one text launch of the largest L, in a kernel of its own.
2. In this process, no kernel:
   - ``RunState.observe`` per stream event (µs) vs. ``TextDisplay.show`` per stream event with ``sys.stdout``
     sent to a StringIO (µs), interleaved, ``--micro-events`` events per sample; plus ``RunState.observe`` per
     ``progress`` event (what ``report()`` costs the kernel);
   - ``PanelDisplay.bundle()`` (ms) and its size (KB of JSON) for 2 and 8 ranks, each with a full column of 200
     lines (250 fed, so 50 dropped) and 200 history points (250 ``report()`` events fed), split into the state's
     ``to_json()``, the ``text/html`` and the ``text/plain`` fallbacks; plus jupyter_client's
     ``Session.pack`` of the bundle (the JSON serialization the kernel does before sending it on IOPub).

3. ``--browser`` (its own options: ``--ranks 2,16,32,64 --seconds 10 --reps 3``): the panel at 2 to 64 ranks
   printing 20 lines a second each, in a real JupyterLab and Debian's Chromium, beside display="text":
   visible updates, bytes the page receives, kernel CPU, saved output, a click on a rank cell
   (``panel_browser.py``, whose docstring says how; 32 and 64 ranks are a replayed 16-rank run).

Every kernel is shut down and checked gone; the script checks at the end that it has no child processes left.
No timed assertions: the numbers are printed (a table) and written to benchmarks/results/panel_overhead.json;
the headline: observe / show, and execute->idle panel / text per L.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections import Counter

import psutil
from common import (
    KILL_WAIT_S,
    ROOT,
    Kernel,
    arguments,
    finish,
    fmt_ratio,
    kernel_env,
    kill_all,
    log,
    median,
    parse,
    ratio,
    table,
)

import notebook_launcher as nl_pkg
from notebook_launcher.display.panel import MAX_UPDATES_PER_S, PanelDisplay
from notebook_launcher.display.rank_state import HISTORY_POINTS, LINES_PER_RANK
from notebook_launcher.display.state import MIME_TYPE, RunState
from notebook_launcher.display.text import TextDisplay
from notebook_launcher.schema.events import PROGRESS, STREAM, Event

NUM_RANKS = 2
REPORT_EVERY = 10
DISPLAYS = ("panel", "text")
OUTPUT_TYPES = ("stream", "display_data", "update_display_data")
CELL_TIMEOUT_S = 180
LAUNCH_TIMEOUT_S = 150  # notebook_launcher(timeout=...): a hung launch is stopped, never waited on forever
BUNDLE_RANKS = (2, 8)
FEED_PER_RANK = 250  # > LINES_PER_RANK and HISTORY_POINTS: full columns, full charts
LINE_RE = re.compile(r"^\[rank (\d+)\] line (\d+) of rank (\d+): loss [0-9.]+$", re.MULTILINE)


def line_text(i: int, rank: int) -> str:
    return f"line {i} of rank {rank}: loss {1.0 / (i + 1):.6f}"


# --------------------------------------------------------------------------------------------------------------
# 1. In a real kernel
# --------------------------------------------------------------------------------------------------------------
SETUP_CELL = f'''\
import json, os, sys, time
from collections import Counter
sys.path.insert(0, {ROOT!r})
import torch  # as in a training notebook; without it every forked worker imports torch itself (~1 s a launch)
from notebook_launcher import last_run, notebook_launcher, report

def work(n, every, quiet=0.0):
    rank = int(os.environ["RANK"])
    for i in range(n):
        print("line %d of rank %d: loss %.6f" % (i, rank, 1.0 / (i + 1)))
        if (i + 1) % every == 0:
            report(step=i + 1, total=n, loss=1.0 / (i + 1))
    time.sleep(quiet)  # a quiet stretch (a long step, evaluation): nothing new to show
    return rank

def run_summary(n):
    run = last_run()
    ours = Counter()   # the n lines each rank printed
    other = Counter()  # any other output line of the rank (warnings, tracebacks...): the panel counts them too
    for e in run.events:
        if e.kind == "stream" and not e.data.get("redraw"):
            (ours if str(e.data.get("text", "")).startswith("line ") else other)[e.rank] += 1
        elif e.kind == "log" and "message" in e.data:
            other[e.rank] += 1
        elif e.kind == "failure" or (e.kind == "exit" and e.data.get("signal_name")
                                    and not e.data.get("stopped_by_launcher")):
            other[e.rank] += 1
    progress = Counter(e.rank for e in run.events if e.kind == "progress")
    state = getattr(run, "panel_state", None)
    ranks = None
    if state:
        ranks = {{r["rank"]: {{"lines": len(r["lines"]), "lines_total": r["lines_total"],
                             "lines_dropped": r["lines_dropped"], "history": len(r["history"]),
                             "step": (r["progress"] or {{}}).get("step")}} for r in state["ranks"]}}
    return {{"status": run.status, "duration_s": run.duration, "events_dropped": run.events_dropped,
            "own_lines": dict(ours), "other_lines": dict(other), "progress_events": dict(progress),
            "panel_ranks": ranks}}

for _display in ("panel", "text"):  # warm: imports, first fork, both displays
    notebook_launcher(work, args=(20, {REPORT_EVERY}), num_processes=2, device="cpu", display=_display)
None
'''

LAUNCH_CELL = ("notebook_launcher(work, args=({n}, {every}, {quiet}), num_processes=2, device='cpu', "
               "display={display!r}, timeout={timeout});")
SUMMARY_CELL = "print(json.dumps(run_summary({n})))"


def output_counts(cell: dict) -> dict:
    """What the frontend got from one cell: its output messages (OUTPUT_TYPES) counted and their JSON bytes summed
    by type, the panel's last state (the last display message's MIME_TYPE data, None without one), and the timeline
    [(seconds since execute, type, bytes), ...]."""
    counts, sizes, timeline, last_state = Counter(), Counter(), [], None
    for output in cell["outputs"]:
        kind, content = output["msg_type"], output["content"]
        if kind not in OUTPUT_TYPES:
            continue
        size = len(json.dumps(content))
        counts[kind] += 1
        sizes[kind] += size
        timeline.append((round(output["t"], 4), kind, size))
        if kind in ("display_data", "update_display_data") and MIME_TYPE in content.get("data", {}):
            last_state = content["data"][MIME_TYPE]
    return {"messages": dict(counts), "bytes": dict(sizes), "last_state": last_state, "timeline": timeline}


def check_panel(n: int, state: dict | None, summary: dict) -> dict:
    """Nothing lost in the panel's count: per rank, lines_total == n + the rank's other lines, and so on."""
    problems = []
    if state is None:
        return {"ok": False, "problems": ["no panel display message on IOPub"], "ranks": {}}
    ranks = {}
    for rank_state in state["ranks"]:
        rank = rank_state["rank"]
        other = summary["other_lines"].get(str(rank), 0)
        expected_total = n + other
        lines = len(rank_state["lines"])
        ranks[rank] = {"lines": lines, "lines_total": rank_state["lines_total"],
                       "lines_dropped": rank_state["lines_dropped"], "other_lines": other,
                       "history": len(rank_state["history"]), "step": (rank_state["progress"] or {}).get("step")}
        if rank_state["lines_total"] != expected_total:
            problems.append(f"rank {rank}: lines_total {rank_state['lines_total']} != {n} + {other}")
        if rank_state["lines_dropped"] != rank_state["lines_total"] - lines:
            problems.append(f"rank {rank}: lines_dropped {rank_state['lines_dropped']} != lines_total - {lines}")
        if lines != min(LINES_PER_RANK, expected_total):
            problems.append(f"rank {rank}: {lines} lines kept, not {min(LINES_PER_RANK, expected_total)}")
        if summary["own_lines"].get(str(rank), 0) != n and not summary["events_dropped"]:
            problems.append(f"rank {rank}: {summary['own_lines'].get(str(rank), 0)} of {n} lines in last_run()")
        if ranks[rank]["step"] != n - n % REPORT_EVERY:
            problems.append(f"rank {rank}: last step {ranks[rank]['step']}, not {n - n % REPORT_EVERY}")
    if sorted(ranks) != list(range(NUM_RANKS)):
        problems.append(f"ranks in the panel: {sorted(ranks)}")
    if state["status"] != "finished":
        problems.append(f"panel status {state['status']!r}")
    if summary["panel_ranks"] and {int(k): v["lines_total"] for k, v in summary["panel_ranks"].items()} != {
            k: v["lines_total"] for k, v in ranks.items()}:
        problems.append("last IOPub state != last_run().panel_state")
    return {"ok": not problems, "problems": problems, "ranks": ranks}


def check_text(n: int, stdout: str) -> dict:
    arrived = Counter()
    for rank, _, of_rank in LINE_RE.findall(stdout):
        if rank == of_rank:
            arrived[int(rank)] += 1
    per_rank = {rank: arrived.get(rank, 0) for rank in range(NUM_RANKS)}
    lost = sum(max(0, n - count) for count in per_rank.values())
    return {"ok": lost == 0, "problems": [f"{lost} lines lost on IOPub"] if lost else [], "iopub_lines": per_rank}


def scenario(n: int, quiet: float) -> str:
    return f"L={n:,}" + (f" + {quiet:g} s quiet" if quiet else "")


def bench_in_kernel(directory: str, lines: list[int], reps: int, quiet: float) -> dict:
    env = kernel_env(directory)
    env.pop("NOTEBOOK_LAUNCHER_DISPLAY", None)
    kernel = Kernel(directory, env, cell_timeout_s=CELL_TIMEOUT_S)
    cases = [(n, 0.0) for n in lines] + ([(min(lines), quiet)] if quiet else [])
    combos = [(n, q, display) for n, q in cases for display in DISPLAYS]
    samples = {f"{display}/{scenario(n, q)}": [] for n, q, display in combos}
    try:
        kernel.run(SETUP_CELL)
        for rep in range(reps):
            shift = rep % len(combos)
            for n, q, display in combos[shift:] + combos[:shift]:
                cell = kernel.run(LAUNCH_CELL.format(n=n, every=REPORT_EVERY, quiet=q, display=display,
                                                     timeout=LAUNCH_TIMEOUT_S))
                cell.update(output_counts(cell))
                summary = json.loads(kernel.run(SUMMARY_CELL.format(n=n))["stdout"])
                check = check_panel(n, cell["last_state"], summary) if display == "panel" else check_text(
                    n, cell["stdout"])
                if summary["status"] != "finished":
                    check["ok"] = False
                    check["problems"].append(f"run status {summary['status']!r}")
                sample = {"rep": rep, "execute_to_reply_s": cell["reply_s"], "execute_to_idle_s": cell["idle_s"],
                          "launch_duration_s": summary["duration_s"], "messages": cell["messages"],
                          "messages_total": sum(cell["messages"].values()), "bytes": cell["bytes"],
                          "bytes_total": sum(cell["bytes"].values()), "events_dropped": summary["events_dropped"],
                          "progress_events": summary["progress_events"], "check": check,
                          "timeline": cell["timeline"]}
                samples[f"{display}/{scenario(n, q)}"].append(sample)
                log(f"  rep {rep} {display:5s} {scenario(n, q):>18}: reply {cell['reply_s']:.2f} s, idle {cell['idle_s']:.2f} s, "
                    f"launch {summary['duration_s']:.2f} s, {cell['messages']} "
                    f"{sum(cell['bytes'].values()) / 1024:,.0f} KB"
                    + ("" if check["ok"] else f"  PROBLEMS: {check['problems']}"))
    finally:
        closed = kernel.close()
    summary = {}
    for n, q in cases:
        row = {}
        for display in DISPLAYS:
            runs = samples[f"{display}/{scenario(n, q)}"]
            row[display] = {
                "execute_to_reply_s": median([s["execute_to_reply_s"] for s in runs]),
                "execute_to_idle_s": median([s["execute_to_idle_s"] for s in runs]),
                "launch_duration_s": median([s["launch_duration_s"] for s in runs]),
                "messages_total": median([s["messages_total"] for s in runs]),
                "messages_by_type": {t: median([s["messages"].get(t, 0) for s in runs]) for t in OUTPUT_TYPES},
                "bytes_total": median([s["bytes_total"] for s in runs]),
                "all_checks_ok": all(s["check"]["ok"] for s in runs),
            }
        if samples[f"panel/{scenario(n, q)}"]:
            row["panel"]["final_ranks_last_rep"] = samples[f"panel/{scenario(n, q)}"][-1]["check"]["ranks"]
        row["ratios_panel_over_text"] = {
            key: ratio(row["panel"][key], row["text"][key])
            for key in ("execute_to_reply_s", "execute_to_idle_s", "launch_duration_s", "messages_total",
                        "bytes_total")}
        if q:  # output messages sent while nothing happened: from the time the same run without the quiet
            # stretch is over (+0.3 s) until the quiet stretch ends (q s after the ranks printed their last line)
            window = (max(summary[f"L={n:,}"][d]["execute_to_idle_s"] for d in DISPLAYS) + 0.3, q)
            row["quiet_window_s"] = window
            row["per_quiet_s"] = {}
            for display in DISPLAYS:
                inside = [[(t, kind, size) for t, kind, size in s["timeline"] if window[0] <= t < window[1]]
                          for s in samples[f"{display}/{scenario(n, q)}"]]
                length = window[1] - window[0]
                row["per_quiet_s"][display] = {
                    "messages": median([len(msgs) / length for msgs in inside]),
                    "kb": median([sum(size for _, _, size in msgs) / 1024 / length for msgs in inside])}
        summary[scenario(n, q)] = row
    return {"samples": samples, "medians": summary, "kernel_close": closed}


def profile_in_kernel(directory: str, n: int) -> dict:
    """cProfile of the launching cell (the thread that runs the display) for one panel and one text launch."""
    kernel = Kernel(directory, kernel_env(directory), cell_timeout_s=CELL_TIMEOUT_S)
    out = {}
    try:
        kernel.run(SETUP_CELL + "\nimport cProfile, io, pstats\n")
        for display in DISPLAYS:
            launch = LAUNCH_CELL.format(n=n, every=REPORT_EVERY, quiet=0, display=display, timeout=LAUNCH_TIMEOUT_S)
            code = (f"_p = cProfile.Profile(); _p.enable()\n{launch}\n"
                    f"_p.disable(); _s = io.StringIO()\n"
                    f"pstats.Stats(_p, stream=_s).sort_stats('tottime').print_stats(15)\n"
                    f"_PROFILE = _s.getvalue()")
            kernel.run(code)
            out[display] = kernel.run("print(_PROFILE)")["stdout"].strip("\n")
    finally:
        out["kernel_close"] = kernel.close()
    return out


# --------------------------------------------------------------------------------------------------------------
# 2. In this process: RunState.observe vs TextDisplay.show, PanelDisplay.bundle()
# --------------------------------------------------------------------------------------------------------------
def new_state(ranks: int) -> RunState:
    return RunState("bench-run", "/tmp/bench-run", "cpu", "gloo", "fork", ranks, ranks, range(ranks))


def stream_events(count: int, ranks: int) -> list[Event]:
    now = time.monotonic()
    return [Event(rank=i % ranks, seq=i // ranks, time=now + i * 1e-5, kind=STREAM,
                  data={"stream": "stdout", "text": line_text(i // ranks, i % ranks)}) for i in range(count)]


def progress_events(count: int, ranks: int) -> list[Event]:
    now = time.monotonic()
    return [Event(rank=i % ranks, seq=i // ranks, time=now + i * 1e-3, kind=PROGRESS,
                  data={"step": (i // ranks + 1) * REPORT_EVERY, "total": count // ranks * REPORT_EVERY,
                        "metrics": {"loss": 1.0 / (i + 1), "lr": 1e-3}}) for i in range(count)]


def time_observe(events: list[Event]) -> float:
    state = new_state(NUM_RANKS)
    observe = state.observe
    start = time.perf_counter()
    for event in events:
        observe(event)
    return (time.perf_counter() - start) / len(events) * 1e6


def time_text_show(events: list[Event]) -> float:
    display = TextDisplay("[rank ${rank}] ", 0, NUM_RANKS)
    show = display.show
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        start = time.perf_counter()
        for event in events:
            show(event)
        elapsed = time.perf_counter() - start
    return elapsed / len(events) * 1e6


def full_panel(ranks: int) -> PanelDisplay:
    """A panel whose every rank has a full column of lines and full charts, fed with synthetic events."""
    state = new_state(ranks)
    now = time.monotonic()
    for i in range(FEED_PER_RANK):
        for rank in range(ranks):
            state.observe(Event(rank=rank, seq=2 * i, time=now + i * 0.01, kind=STREAM,
                                data={"stream": "stdout", "text": line_text(i, rank)}))
            state.observe(Event(rank=rank, seq=2 * i + 1, time=now + i * 0.01, kind=PROGRESS,
                                data={"step": (i + 1) * REPORT_EVERY, "total": FEED_PER_RANK * REPORT_EVERY,
                                      "metrics": {"loss": 1.0 / (i + 1), "lr": 1e-3}}))
    state.note("2 processes on cpu (gloo), start method fork: safe here")
    for rank_state in state.ranks.values():
        assert len(rank_state.lines) == LINES_PER_RANK and len(rank_state.history) == HISTORY_POINTS
    return PanelDisplay(state)


def bench_micro(events_per_sample: int, reps: int, bundle_reps: int) -> dict:
    streams = stream_events(events_per_sample, NUM_RANKS)
    progress = progress_events(events_per_sample // 10, NUM_RANKS)
    observe_us, text_us, progress_us = [], [], []
    methods = [("observe", lambda: observe_us.append(time_observe(streams))),
               ("text", lambda: text_us.append(time_text_show(streams))),
               ("progress", lambda: progress_us.append(time_observe(progress)))]
    for rep in range(reps):
        shift = rep % len(methods)
        for _, method in methods[shift:] + methods[:shift]:
            method()
    result = {
        "events_per_sample": events_per_sample, "reps": reps,
        "observe_stream_us_samples": observe_us, "text_show_stream_us_samples": text_us,
        "observe_progress_us_samples": progress_us,
        "observe_stream_us": median(observe_us), "text_show_stream_us": median(text_us),
        "observe_progress_us": median(progress_us),
        "observe_over_text_show": median(observe_us) / median(text_us),
        "bundle": {},
    }
    from jupyter_client.session import Session

    from notebook_launcher.display.fallback import render_html, render_text

    session = Session()

    for ranks in BUNDLE_RANKS:
        panel = full_panel(ranks)
        timings = {"bundle_ms": [], "to_json_ms": [], "html_ms": [], "text_ms": [], "serialize_ms": []}
        for rep in range(bundle_reps):
            start = time.perf_counter()
            bundle = panel.bundle()
            timings["bundle_ms"].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            payload = panel.state.to_json()
            timings["to_json_ms"].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            render_html(payload)
            timings["html_ms"].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            render_text(payload)
            timings["text_ms"].append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            session.pack(bundle)  # what the kernel's Session does with the message content before sending it
            timings["serialize_ms"].append((time.perf_counter() - start) * 1e3)
        sizes_kb = {key: len(json.dumps(value)) / 1024 for key, value in bundle.items()}
        result["bundle"][ranks] = {
            **{key: median(values) for key, values in timings.items()},
            "samples": timings,
            "size_kb": sum(sizes_kb.values()), "size_kb_by_mime": sizes_kb,
            "kb_per_s_at_max_rate": sum(sizes_kb.values()) * MAX_UPDATES_PER_S,
        }
    return result


# --------------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--browser" in argv:  # 3. many ranks in a real JupyterLab and browser: panel_browser.py
        import panel_browser

        return panel_browser.main([arg for arg in argv if arg != "--browser"])
    parser = arguments(__doc__, "panel_overhead")
    parser.add_argument("--lines", default="2000,20000", help="lines per rank, comma-separated (in the kernel)")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions per (lines, display)")
    parser.add_argument("--micro-events", type=int, default=100_000, help="stream events per in-process sample")
    parser.add_argument("--micro-reps", type=int, default=7, help="in-process samples per method")
    parser.add_argument("--bundle-reps", type=int, default=20, help="bundle() calls per rank count")
    parser.add_argument("--quiet-s", type=float, default=5.0,
                        help="also run the smallest --lines followed by this many quiet seconds (0: don't)")
    parser.add_argument("--skip-kernel", action="store_true", help="only the in-process micro-costs")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile one panel and one text launch of the largest --lines in a kernel")
    options = parse(parser, argv, smoke={"lines": "200", "reps": 1, "quiet_s": 0, "micro_events": 2_000,
                                         "micro_reps": 1, "bundle_reps": 1})
    lines = [int(x) for x in options.lines.split(",") if x.strip()]

    directory = tempfile.mkdtemp(prefix="nl-panel-bench-")
    os.environ["NOTEBOOK_LAUNCHER_RUNS_DIR"] = os.path.join(directory, "runs")
    started = time.monotonic()
    results = {
        "machine": {"python": platform.python_version(), "notebook_launcher": nl_pkg.__version__,
                    "cpus": os.cpu_count(), "platform": platform.platform(), "load_average_start": os.getloadavg()},
        "options": vars(options),
    }
    try:
        import ipykernel
        import jupyter_client

        results["machine"].update(ipykernel=ipykernel.__version__, jupyter_client=jupyter_client.__version__)
        log("2. in-process micro-costs")
        results["micro"] = bench_micro(options.micro_events, options.micro_reps, options.bundle_reps)
        if not options.skip_kernel:
            log(f"1. in a real kernel: 2 ranks x {lines} lines, {options.reps} interleaved reps")
            results["kernel"] = bench_in_kernel(directory, lines, options.reps, options.quiet_s)
            if options.profile:
                log("cProfile of the launching cell")
                results["profile"] = profile_in_kernel(directory, max(lines))
    finally:
        leftovers = kill_all(psutil.Process().children(recursive=True), wait_s=KILL_WAIT_S)
        shutil.rmtree(directory, ignore_errors=True)
    results["leftover_children_killed"] = leftovers
    results["temp_dir_removed"] = not os.path.exists(directory)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["total_s"] = time.monotonic() - started

    kernel = results.get("kernel")
    if kernel:
        rows = []
        for name, row in kernel["medians"].items():
            panel, text, ratios = row["panel"], row["text"], row["ratios_panel_over_text"]
            for label, key, form in (("execute->reply (s)", "execute_to_reply_s", "{:.2f}"),
                                     ("execute->idle (s)", "execute_to_idle_s", "{:.2f}"),
                                     ("launch duration (s)", "launch_duration_s", "{:.2f}"),
                                     ("IOPub output messages", "messages_total", "{:.0f}"),
                                     ("IOPub output KB", "bytes_total", None)):
                fmt = (lambda v: f"{v / 1024:,.0f}") if form is None else form.format
                rows.append((f"{name}: {label}", fmt(panel[key]), fmt(text[key]), fmt_ratio(ratios[key], "-")))
            by_type = ", ".join(f"{t} {panel['messages_by_type'][t]:.0f}" for t in OUTPUT_TYPES
                                if panel["messages_by_type"][t])
            final = panel.get("final_ranks_last_rep", {})
            counts = "; ".join(f"rank {r}: {v['lines']} lines, total {v['lines_total']:,}, dropped "
                               f"{v['lines_dropped']:,}" for r, v in sorted(final.items()))
            rows.append((f"{name}: panel messages by type", by_type, "", ""))
            rows.append((f"{name}: panel final state", counts, "", ""))
            if "per_quiet_s" in row:
                quiet = row["per_quiet_s"]
                rows.append((f"{name}: sent per quiet second",
                             f"{quiet['panel']['messages']:.2f} msg, {quiet['panel']['kb']:,.0f} KB",
                             f"{quiet['text']['messages']:.2f} msg, {quiet['text']['kb']:,.0f} KB", ""))
            rows.append((f"{name}: nothing lost (every rep)", "yes" if panel["all_checks_ok"] else "NO",
                         "yes" if text["all_checks_ok"] else "NO", ""))
        print(f"1. in a real kernel, 2 CPU ranks, print L lines + report() every {REPORT_EVERY} lines, "
              f"medians of {options.reps} interleaved reps")
        print(table(("what", "panel", "text", "panel/text"), rows))
        print()

    micro = results["micro"]
    rows = [("RunState.observe, stream event (us)", f"{micro['observe_stream_us']:.2f}"),
            ("TextDisplay.show, stream event -> StringIO (us)", f"{micro['text_show_stream_us']:.2f}"),
            ("observe / show", fmt_ratio(micro["observe_over_text_show"], "-")),
            ("RunState.observe, progress event (us)", f"{micro['observe_progress_us']:.2f}")]
    for ranks, bundle in micro["bundle"].items():
        parts = f"to_json {bundle['to_json_ms']:.2f} + html {bundle['html_ms']:.2f} + text {bundle['text_ms']:.2f}"
        rows += [(f"bundle(), {ranks} ranks (ms): {parts}", f"{bundle['bundle_ms']:.2f}"),
                 (f"Session.pack(bundle), {ranks} ranks (ms): serializing it for IOPub",
                  f"{bundle['serialize_ms']:.2f}"),
                 (f"bundle size, {ranks} ranks (KB): " + ", ".join(
                     f"{k.split('/')[-1].split('.')[-1]} {v:,.0f}" for k, v in bundle["size_kb_by_mime"].items()),
                  f"{bundle['size_kb']:,.0f}")]
    print(f"2. in-process micro-costs (medians of {options.micro_reps} interleaved samples of "
          f"{options.micro_events:,} events; bundle: {options.bundle_reps} calls; 200 lines + 200 history per rank)")
    print(table(("what", "value"), rows))
    if results.get("profile"):
        for display in DISPLAYS:
            print(f"\ncProfile of the launching cell, display={display!r}, L={max(lines):,}:")
            print(results["profile"][display])
    if leftovers:
        print(f"warning: had to kill leftover child processes {leftovers}")
    if kernel and not kernel["kernel_close"]["kernel_gone"]:
        print("warning: the kernel did not exit by itself")
    print(f"\nload average {results['machine']['load_average_start'][0]:.2f} -> "
          f"{results['machine']['load_average_end'][0]:.2f}; total {results['total_s']:.0f} s")
    headline = {"observe / show (in-process)": micro["observe_over_text_show"]}
    for name, row in (kernel or {}).get("medians", {}).items():
        headline[f"{name}: execute->idle, panel / text"] = row["ratios_panel_over_text"]["execute_to_idle_s"]
    return finish(options, results, headline)


if __name__ == "__main__":
    sys.exit(main())
