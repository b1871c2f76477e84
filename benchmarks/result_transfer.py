"""A large result on its way back: the kernel's and the rank's peak memory, and launch → return, before and after
a change, side by side.

    .venv/bin/python benchmarks/result_transfer.py                      # baseline: the tree before results owned
    .venv/bin/python benchmarks/result_transfer.py --baseline HEAD~3 --reps 5 --gib 1

Each measurement is a fresh Python process (so its peaks are its own) that launches 2 CPU ranks, rank 0
returning ``--gib`` GiB of float32 in a dict, and reports: the kernel's peak resident memory above what it held
before the call (VmHWM after ``clear_refs``), the largest rank's peak resident memory (``RUSAGE_CHILDREN``),
the time from the call to its return, and whether every byte came back right. Two kinds of result:

- ``cpu``: a CPU tensor (its ``.cpu()`` is itself): what a CPU run returns;
- ``copied``: a tensor whose ``.cpu()`` is a fresh copy, as a GPU's or a TPU's is: the rank holds the copy until
  it is written, so its peak is the tensor plus its copy (on a GPU the tensor is in GPU memory: the host then
  holds the copy only).

The baseline is a git worktree of ``--baseline`` (default: the commit before the fix), removed at the end.
Measurements of the two trees and both kinds are interleaved, ``--reps`` times; medians and the spread
(min–max) are printed and written to ``benchmarks/results/result_transfer.json``; the headline: the kernel's
peak, this tree over the baseline, per kind. (``--smoke`` measures this tree against itself, cpu only: no worktree.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from common import ROOT, arguments, finish, median, parse, ratio, table

BASELINE = "6f29b67"  # main before a result's byte views kept their storages alive

MEASURE = r'''
import json, os, resource, sys, time
import torch
from notebook_launcher import notebook_launcher

ELEMENTS = int(float(sys.argv[1]) * 2**30) // 4
KIND = sys.argv[2]

class CopiedByCpu(torch.Tensor):
    def cpu(self, *args, **kwargs):
        return torch.Tensor.cpu(self, *args, **kwargs).as_subclass(torch.Tensor).clone()

def returns_big():
    import torch.distributed as dist
    if dist.get_rank() != 0:
        return None
    weight = torch.arange(ELEMENTS, dtype=torch.float32)
    return {"weight": weight.as_subclass(CopiedByCpu) if KIND == "copied" else weight, "step": 3}

def status_kb(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")
before = status_kb("VmRSS")
started = time.monotonic()
outcome = "ok"
try:
    result = notebook_launcher(returns_big, num_processes=2, device="cpu", display="text", results="rank0")
    elapsed = time.monotonic() - started
    kernel_peak = (status_kb("VmHWM") - before) * 1024  # (before the check, which allocates its own)
    chunk = 2**24
    weight = result["weight"]
    if weight.numel() != ELEMENTS or not all(
            torch.equal(weight[start:start + chunk], torch.arange(start, min(start + chunk, ELEMENTS),
                                                                  dtype=torch.float32))
            for start in range(0, ELEMENTS, chunk)):
        outcome = "wrong bytes"
except Exception as error:  # noqa: BLE001 - a baseline that fails is a figure too
    elapsed = time.monotonic() - started
    kernel_peak = (status_kb("VmHWM") - before) * 1024
    outcome = f"{type(error).__name__}"
rank_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print("RESULT " + json.dumps({"kernel_peak": kernel_peak, "rank_peak": rank_peak, "seconds": elapsed,
                              "outcome": outcome}))
'''


def measure(tree: str, gib: float, kind: str, runs_dir: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree, "NOTEBOOK_LAUNCHER_RUNS_DIR": runs_dir}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(gib), kind], capture_output=True, text=True,
                          timeout=600, env=env, cwd=tree)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"kernel_peak": None, "rank_peak": None, "seconds": None,
            "outcome": f"exit {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:80]}"}


def main(argv=None) -> int:
    parser = arguments(__doc__, "result_transfer")
    parser.add_argument("--baseline", default=BASELINE, help="git ref of the tree to compare with")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gib", type=float, default=1.0, help="size of rank 0's result in GiB")
    parser.add_argument("--kinds", default="cpu,copied", help="kinds of result, comma-separated")
    options = parse(parser, argv, smoke={"reps": 1, "gib": 0.01, "baseline": None, "kinds": "cpu"})
    kinds = options.kinds.split(",")
    work = tempfile.mkdtemp(prefix="result_transfer-")
    baseline_tree = os.path.join(work, "baseline") if options.baseline else ROOT
    if options.baseline:
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", baseline_tree, options.baseline],
                       check=True, capture_output=True)
    trees = {"baseline": baseline_tree, "current": ROOT}
    samples: dict = {(tree, kind): [] for tree in trees for kind in kinds}
    try:
        for rep in range(options.reps):
            order = list(samples)
            order = order[rep % len(order):] + order[:rep % len(order)]  # rotated: drift hits every pair alike
            for tree, kind in order:
                samples[tree, kind].append(measure(trees[tree], options.gib, kind, os.path.join(work, "runs")))
    finally:
        if options.baseline:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", baseline_tree], capture_output=True)
        subprocess.run(["rm", "-rf", work])
    size = options.gib * 2**30
    rows, report = [], {"gib": options.gib, "reps": options.reps, "baseline": options.baseline,
                        "load_average_at_end": os.getloadavg(), "samples": {f"{t}/{k}": v for (t, k), v in samples.items()}}
    for (tree, kind), values in samples.items():
        def spread(key, scale):
            got = [v[key] / scale for v in values if v[key] is not None]
            return (f"{median(got):.2f} ({min(got):.2f}-{max(got):.2f})" if got else "n/a")
        outcomes = sorted({v["outcome"] for v in values})
        rows.append([f"{tree} / {kind}", spread("kernel_peak", size), spread("rank_peak", size),
                     spread("seconds", 1), ", ".join(outcomes)])
    print(f"rank 0 returns {options.gib:g} GiB; {options.reps} runs each; median (min-max)")
    print(table(["tree / result", "kernel peak (x size)", "rank peak (x size)", "call to return (s)", "bytes back"],
                rows))
    def kernel_peak(tree, kind):
        return median([v["kernel_peak"] for v in samples[tree, kind] if v["kernel_peak"] is not None])

    return finish(options, report, {f"{kind}: kernel peak, current / baseline": ratio(
        kernel_peak("current", kind), kernel_peak("baseline", kind)) for kind in kinds})


if __name__ == "__main__":
    sys.exit(main())
