"""Prints' throughput beside a rank that displays a 100 KB figure 10 times a second, against no displays.

Run:  .venv/bin/python benchmarks/rich_output_throughput.py      options: --seconds 4 --reps 3 --kb 100

In a real kernel (jupyter_client, ipykernel), the panel showing, 2 ranks for ``--seconds``:
- rank 1 prints as fast as it can (``print(f"line {i}")``), counting its lines: the kernel's reading is what
  limits it (a full pipe makes the rank wait), so lines a second is the kernel's throughput of prints;
- rank 0, case "displays": ``clear_output(wait=True)`` then ``display()`` of a ``--kb`` KB image/png bundle, 10
  times a second (a live plot redrawn in place); case "no displays": it sleeps as long.
Each repetition runs both cases, in an order rotated from one repetition to the next; the table gives medians
with the spread (min-max), the ratio displays / no displays side by side, and the bytes that reach the client
(every IOPub output message of the cell, its content as JSON: what the browser gets), split into the rank's
outputs and the panel's. Every kernel is shut down; the script checks it left no child process. The headline:
prints' throughput, displays / no displays (median).
"""

from __future__ import annotations

import json
import sys
import tempfile

from common import Kernel, arguments, finish, fmt_ratio, kernel_env, live_descendants, median, parse, ratio, table

PANEL_MIME = "application/vnd.notebook-launcher.run.v1+json"
CELL = '''\
import base64, os, time
from notebook_launcher import notebook_launcher, last_run

def bench(seconds, kb, displays):
    import torch.distributed as dist
    from IPython.display import clear_output, display
    end = time.monotonic() + seconds
    if dist.get_rank() == 1:
        count = 0
        while time.monotonic() < end:
            for _ in range(100):
                print(f"line {count} of rank 1")
                count += 1
        return count
    image = base64.b64encode(os.urandom(kb * 1024 * 3 // 4)).decode()
    shown = 0
    while time.monotonic() < end:
        if displays:
            clear_output(wait=True)
            display({"image/png": image, "text/plain": f"<figure {shown}>"}, raw=True)
            shown += 1
        time.sleep(0.1)
    return shown

notebook_launcher(bench, args=(SECONDS, KB, DISPLAYS), num_processes=2, device="cpu", display="panel",
                  results="all")
print("RESULT", last_run().results[1], last_run().results[0])
'''


def one(kernel: Kernel, seconds: float, kb: int, displays: bool) -> dict:
    code = CELL.replace("SECONDS", str(seconds)).replace("KB", str(kb)).replace("DISPLAYS", str(displays))
    answer = kernel.run(code, timeout=seconds + 120)
    lines, shown = (int(value) for value in answer["stdout"].split("RESULT", 1)[1].split())
    rank_bytes = panel_bytes = 0
    for output in answer["outputs"]:
        if output["msg_type"] not in ("display_data", "update_display_data"):
            continue
        size = len(json.dumps(output["content"]))
        if PANEL_MIME in output["content"]["data"]:
            panel_bytes += size
        else:
            rank_bytes += size
    return {"lines_per_s": lines / seconds, "lines": lines, "displays": shown, "rank_bytes": rank_bytes,
            "panel_bytes": panel_bytes, "cell_s": answer["idle_s"]}


def spread(values, unit=""):
    return f"{median(values):,.0f}{unit} ({min(values):,.0f}-{max(values):,.0f})"


def main(argv=None) -> int:
    parser = arguments(__doc__, "rich_output_throughput")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kb", type=int, default=100)
    options = parse(parser, argv, smoke={"seconds": 1.0, "reps": 1, "kb": 10})
    samples = {"no displays": [], "displays": []}
    with tempfile.TemporaryDirectory(prefix="nl-rich-bench-") as directory:
        kernel = Kernel(directory, kernel_env(directory))
        try:
            kernel.run("import notebook_launcher")
            for rep in range(options.reps):
                order = ["no displays", "displays"] if rep % 2 == 0 else ["displays", "no displays"]
                for case in order:
                    samples[case].append(one(kernel, options.seconds, options.kb, case == "displays"))
        finally:
            closed = kernel.close()
    base, rich = samples["no displays"], samples["displays"]
    ratios = [ratio(r["lines_per_s"], b["lines_per_s"]) for r, b in zip(rich, base)]
    rows = [[case, spread([s["lines_per_s"] for s in runs]), spread([s["displays"] for s in runs]),
             spread([s["rank_bytes"] / 1024 for s in runs], " KB"), spread([s["panel_bytes"] / 1024 for s in runs], " KB"),
             f"{median([s['cell_s'] for s in runs]):.1f} s"] for case, runs in samples.items()]
    print(f"2 ranks, {options.seconds:g} s each, {options.reps} repetitions; rank 0 displays a {options.kb} KB "
          f"image/png 10x/s in case 'displays'; medians (min-max)")
    print(table(["case", "rank 1's prints/s", "displays", "rank outputs to client", "panel to client", "cell"],
                rows))
    print(f"prints' throughput, displays / no displays: {fmt_ratio(median(ratios))} "
          f"({fmt_ratio(min(ratios))}-{fmt_ratio(max(ratios))})")
    left = live_descendants()
    print(f"kernel shut down: {closed['kernel_gone']}; processes left: {len(left)}")
    return finish(options, {"options": vars(options), "samples": samples, "ratios": ratios},
                  {"prints/s, displays / no displays": median(ratios)})


if __name__ == "__main__":
    sys.exit(main())
