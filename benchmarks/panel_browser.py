"""The live panel at 2 to 64 ranks in a real JupyterLab and Debian's Chromium, display="panel" vs display="text".

Run:  .venv/bin/python benchmarks/panel_overhead.py --browser      (or this file directly)
      options: --ranks 2,16,32,64 --seconds 10 --reps 3

Every rank prints 20 lines a second (``--seconds`` long) and reports its step 5 times a second. This 2-core
machine starts at most 16 CPU ranks (plan.MAX_RANKS_PER_CORE = 8 per core), so 2 and 16 ranks are real launches
(fork), and 32 and 64 are a real 16-rank run recorded first (display="text", output discarded) and replayed in
the kernel at its pace as 2 or 4 hosts (notebook_launcher/display/replay.py): the kernel, the display, the comm,
JupyterLab and the browser are real; the ranks' processes are the recording's. Per run, in a fresh notebook page
of one JupyterLab server, repetitions interleaved (each repetition runs every case, displays alternating):

- visible updates a second: animation frames in which the launching cell's output changed (a MutationObserver),
  from the first to the last change;
- bytes the page received over its websockets while the cell ran, against the lines' own bytes (each line's
  text + newline, from the run log) + 10 KB/s;
- kernel CPU seconds of the cell (the kernel process only: user + system; its IOPub thread included);
- the saved output: the .ipynb's size minus that of the same notebook without the cell's outputs;
- for the panel's grid (above 8 ranks): a click on a rank cell mid-run until that rank's lines are in the page.

Medians and min-max of the repetitions; written to benchmarks/results/panel_browser.json, with the headline:
bytes received and kernel CPU, panel / text, per rank count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import nbformat
from common import ROOT, arguments, finish, median, parse, ratio, table
from nbformat.v4 import new_code_cell, new_notebook

sys.path.insert(0, os.path.join(ROOT, "tests"))
from helpers.browser import chromium, command, jupyter_lab, open_notebook, quiet_settings  # noqa: E402

RECEIVED: list = []  # (arrival, bytes) of each websocket frame of the page open now
REAL_MAX = 16
WORK = '''\
import json, os, time
import psutil, torch
from notebook_launcher import last_run, notebook_launcher, report

def work(seconds):
    rank = int(os.environ["RANK"])
    for i in range(int(seconds * 20)):
        print(f"rank {rank} line {i}: loss {1.0 / (i + 1):.6f}", flush=True)
        if i % 4 == 3:
            report(step=i // 4 + 1, total=int(seconds * 5), loss=1.0 / (i + 1))
        time.sleep(0.05)
    return rank

def measured(launch, out):
    me = psutil.Process()
    before = me.cpu_times()
    run_dir = launch()
    after = me.cpu_times()
    json.dump({"cpu_s": after.user - before.user + after.system - before.system, "run_dir": run_dir}, open(out, "w"))
'''
OBSERVE = """() => {
  window.__nlFrames = [];
  let changed = false;
  const cells = document.querySelectorAll('.jp-Notebook .jp-Cell');
  const target = cells[cells.length - 1];
  new MutationObserver(() => { changed = true; }).observe(target, {subtree: true, childList: true,
                                                                 characterData: true, attributes: true});
  const tick = () => { if (changed) { window.__nlFrames.push(performance.now()); changed = false; }
                       requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
}"""
CLICK = """rank => new Promise(resolve => {
  const cell = document.querySelector(`.nl-cell[data-rank="${rank}"]`);
  if (!cell) { resolve(null); return; }
  const start = performance.now();
  cell.click();
  const check = () => document.querySelector(`.nl-grid-column[data-rank="${rank}"] .nl-line`)
    ? resolve(performance.now() - start) : requestAnimationFrame(check);
  check(); })"""


def record(seconds: float, directory: str) -> str:
    """A real 16-rank run of ``work``, display="text", its output discarded; returns its run log folder."""
    code = WORK + f"notebook_launcher(work, args=({seconds},), num_processes={REAL_MAX}, device='cpu', " \
                  "display='text')\nimport sys; print(last_run().run_dir, file=sys.stderr)\n"
    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": os.path.join(directory, "recorded")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    return done.stderr.strip().splitlines()[-1]


def line_bytes(run_dir: str) -> int:
    total = 0
    with open(os.path.join(run_dir, "events.jsonl"), encoding="utf-8") as log:
        for line in log:
            event = json.loads(line)
            if event.get("kind") == "stream":
                total += len(str(event["data"].get("text", "")).encode()) + 1
    return total


def one_run(lab, ranks: int, display: str, seconds: float, recorded: str, name: str) -> dict:
    root, url, browser = lab
    out = os.path.join(str(root), f"{name}.json")
    if ranks <= REAL_MAX:
        launch = (f"measured(lambda: (notebook_launcher(work, args=({seconds},), num_processes={ranks}, device='cpu',"
                  f" display={display!r}), last_run().run_dir)[1], {out!r})")
    else:
        launch = ("from notebook_launcher.display.replay import replay\n"
                  f"measured(lambda: (replay({recorded!r}, copies={ranks // REAL_MAX}, display={display!r}), "
                  f"{recorded!r})[1], {out!r})")
    path = os.path.join(str(root), f"{name}.ipynb")
    nbformat.write(new_notebook(cells=[new_code_cell(WORK), new_code_cell(launch)],
                                metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                         "language": "python"}}), path)
    RECEIVED.clear()
    page = open_notebook(browser, url, os.path.basename(path))
    page.evaluate(OBSERVE)
    started = time.monotonic()
    command(page, "notebook:run-all-cells", wait=False)
    clicks = []
    deadline = started + seconds * 6 + 120
    while not os.path.exists(out) and time.monotonic() < deadline:
        if display == "panel" and ranks > 8 and len(clicks) < 3 and time.monotonic() - started > 4 + 1.5 * len(clicks):
            answered = page.evaluate(CLICK, 3 + 7 * len(clicks))
            if answered is not None:
                clicks.append(answered)
        page.wait_for_timeout(200)  # (Playwright delivers the frame events while it is called)
    page.wait_for_timeout(1500)  # the last messages reach the page
    ended = time.monotonic()
    result = json.load(open(out))
    frames = page.evaluate("() => window.__nlFrames")
    command(page, "docmanager:save")
    time.sleep(1.0)
    page.close()
    saved = nbformat.read(path, as_version=4)
    bare = os.path.join(str(root), f"{name}-bare.ipynb")
    saved.cells[1].outputs = []
    nbformat.write(saved, bare)
    window = [size for at, size in RECEIVED if started <= at <= ended]
    span = (frames[-1] - frames[0]) / 1000 if len(frames) > 1 else 0.0
    lines = line_bytes(result["run_dir"]) * (ranks // REAL_MAX if ranks > REAL_MAX else 1)
    duration = ended - started
    return {"ranks": ranks, "display": display, "updates_per_s": (len(frames) - 1) / span if span else 0.0,
            "bytes": sum(window), "line_bytes": lines, "duration_s": duration,
            "allowed_bytes": 3 * lines + 10_000 * duration, "kernel_cpu_s": result["cpu_s"],
            "saved_bytes": os.path.getsize(path) - os.path.getsize(bare), "click_ms": max(clicks) if clicks else None}


def main(argv=None) -> int:
    parser = arguments(__doc__, "panel_browser")
    parser.add_argument("--ranks", default="2,16,32,64")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--code", default=ROOT, help="the checkout the kernels import (another one: a baseline; "
                        "run with PYTHONPATH naming it too, so the server serves its extension)")
    args = parse(parser, argv, smoke={"ranks": "2", "seconds": 2.0, "reps": 1})
    counts = [int(value) for value in args.ranks.split(",")]
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        recorded = record(args.seconds, tmp) if any(count > REAL_MAX for count in counts) else ""
        root = os.path.join(tmp, "lab")
        os.makedirs(root)
        env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": os.path.join(tmp, "runs"),
               "JUPYTER_CONFIG_DIR": os.path.join(tmp, "cfg"),
               "JUPYTERLAB_SETTINGS_DIR": quiet_settings(os.path.join(tmp, "settings")),
               "PYTHONPATH": os.pathsep.join(p for p in (args.code, os.environ.get("PYTHONPATH", "")) if p)}
        samples = []
        with jupyter_lab(root, env) as url, chromium(os.path.join(tmp, "profile")) as browser:
            lab = (root, url, browser)
            browser.on("page", lambda page: page.on("websocket", lambda socket: socket.on(
                "framereceived", lambda payload: RECEIVED.append((time.monotonic(), len(payload))))))
            for rep in range(args.reps):
                for index, count in enumerate(counts):
                    order = ("panel", "text") if (rep + index) % 2 == 0 else ("text", "panel")
                    for display in order:
                        sample = one_run(lab, count, display, args.seconds, recorded, f"r{rep}-{count}-{display}")
                        sample["rep"] = rep
                        samples.append(sample)
                        print(json.dumps(sample), flush=True)
                        load.append(os.getloadavg())
    rows, summary = [], []
    for count in counts:
        for display in ("panel", "text"):
            group = [s for s in samples if s["ranks"] == count and s["display"] == display]
            stats = {key: (median([s[key] for s in group if s[key] is not None] or [None]),
                           min((s[key] for s in group if s[key] is not None), default=None),
                           max((s[key] for s in group if s[key] is not None), default=None))
                     for key in ("updates_per_s", "bytes", "allowed_bytes", "kernel_cpu_s", "saved_bytes",
                                 "click_ms", "line_bytes")}
            summary.append({"ranks": count, "display": display, **stats})
            fmt = (lambda v, f: "-" if v is None else f.format(v))
            rows.append([count, display] + [f"{fmt(stats[k][0], f)} ({fmt(stats[k][1], f)}-{fmt(stats[k][2], f)})"
                                            for k, f in (("updates_per_s", "{:.1f}"), ("bytes", "{:,.0f}"),
                                                         ("allowed_bytes", "{:,.0f}"), ("kernel_cpu_s", "{:.2f}"),
                                                         ("saved_bytes", "{:,.0f}"), ("click_ms", "{:.0f}"))])
    print(table(["ranks", "display", "updates/s", "bytes received", "allowed (3x lines + 10 KB/s)",
                 "kernel CPU s", "saved bytes", "click ms"], rows))
    print("load average (1, 5, 15 min) before and after each run:", [tuple(round(v, 2) for v in l) for l in load])
    medians = {(row["ranks"], row["display"]): row for row in summary}
    headline = {f"{count} ranks: {label}, panel / text": ratio(medians[count, "panel"][key][0],
                                                              medians[count, "text"][key][0])
                for count in counts for label, key in (("bytes received", "bytes"), ("kernel CPU", "kernel_cpu_s"))}
    return finish(args, {"code": args.code, "samples": samples, "summary": summary, "load": load,
                         "seconds": args.seconds}, headline)


if __name__ == "__main__":
    sys.exit(main())
