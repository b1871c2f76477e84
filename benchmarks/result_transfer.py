"""A large result on its way back, side by side in one run: ours, the old tree's pipe, torch.multiprocessing's
queue (what Lightning's ``ddp_notebook`` uses) and a bare memcpy of the same bytes (the limit).

    .venv/bin/python benchmarks/result_transfer.py                          # 64 MiB, 1 GiB, 2 GiB; 5 runs each
    .venv/bin/python benchmarks/result_transfer.py --sizes 0.0625,1,4 --baseline 0ae8ee5 --reps 7
    .venv/bin/python benchmarks/result_transfer.py --copied     # ours and old: tensors copied off a "device"
    .venv/bin/python benchmarks/result_transfer.py --machine-memory --sizes 1 --reps 3   # every copy at once
    .venv/bin/python benchmarks/result_transfer.py --smoke      # 10 MiB, one round, no baseline tree

Each measurement is a fresh Python process (so its peaks are its own). ``ours`` and ``old`` launch 2 CPU ranks
(this tree, and a git worktree of ``--baseline``, the pipe path), rank 0 returning a dict of 64 float32 tensors of
``size`` bytes in all; ``queue`` forks 2 processes with ``torch.multiprocessing.start_processes`` (each joins a
gloo group and takes its share of the cores for torch's threads, as a launch's ranks and Lightning's do), rank 0
puts the same dict on a ``SimpleQueue`` (torch moves each storage to shared memory and the parent maps it) and the
parent takes it; ``memcpy`` copies the same bytes once, ``ctypes.memmove`` into fresh memory. Figures per size:

- ``total``: from the call to the value in the caller (memcpy: the copy; notebook_launcher is imported before);
- ``transfer``: from the moment rank 0's function returns (its clock, ``CLOCK_MONOTONIC``, is the caller's) to
  the value in the caller with every process of the launch gone, as a launcher returns it (ours returns then;
  Lightning's ``ddp_notebook`` joins its processes before it takes the value): the result's way back and the
  ranks' exits (``queue, before join``: the queue's value in the parent before its processes are joined, the
  exits left out; memcpy: the copy into fresh memory, whose pages are allocated as it goes, as any new copy's
  are; ``memcpy, touched``: the same copy again into the same memory, the bytes alone);
- ``kernel peak``: the caller's peak resident memory above what it held before, after every byte of the result
  has been read (the check), as a multiple of the size, less the library code the call paged in for the first time
  (the growth of ``RssFile``: torch's and the launcher's code, shared with every process and not a copy of the
  result; the figure with it is kept as ``kernel_peak_with_code``); the check's own operations are run once on a
  small tensor before, so that their first use counts in no path; ``rank peak``: the largest child's; ``machine peak``
  (with ``--machine-memory``, which samples it every 0.5 ms from a thread of the caller, so its times are not
  figures): the machine's anonymous and shared memory (/proc/meminfo) above what it held before: every copy of
  the result at once, in every process and in shared memory.

The four are interleaved, rotated each round, ``--reps`` rounds; medians and the spread (min–max) are printed
and written to ``benchmarks/results/result_transfer.json`` with the load average before and after; the headline:
ours over the queue and over memcpy, per size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from common import ROOT, arguments, exit_with, finish, median, parse, ratio, table

BASELINE = "0ae8ee5"  # main with the result through the pipe
TENSORS = 64

MEASURE = r'''
import ctypes, json, os, resource, sys, time
import torch

SIZE, MODE, TENSORS, COPIED = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[5] == "copied"
EACH = SIZE // TENSORS // 4
SAMPLED = sys.argv[6] == "machine"  # the machine's memory sampled every half millisecond (not timed then)

class CopiedByCpu(torch.Tensor):  # .cpu() is a fresh copy, as a GPU's or a TPU's is
    def cpu(self, *args, **kwargs):
        return torch.Tensor.cpu(self, *args, **kwargs).as_subclass(torch.Tensor).clone()

def make_result():
    return {f"layer{i}.weight": torch.full((EACH,), float(i)) for i in range(TENSORS)}, time.monotonic()

def returns_big():
    import torch.distributed as dist
    if dist.get_rank() != 0:
        return None
    result, _ = make_result()
    if COPIED:
        result = {name: tensor.as_subclass(CopiedByCpu) for name, tensor in result.items()}
    return {"state": result, "returned_at": time.monotonic()}

def queue_rank(index, queue, taken):
    import torch.distributed as dist
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // 2))  # (the cores shared out: Lightning's, ours)
    dist.init_process_group("gloo", rank=index, world_size=2)
    if index == 0:
        result, _ = make_result()
        queue.put({"state": result, "returned_at": time.monotonic()})
        taken.wait()  # (the parent takes each storage's descriptor from this process)
    dist.destroy_process_group()

def status_kb(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

def memcpy():
    source, _ = make_result()
    started = time.monotonic()
    copies = {}
    for name, tensor in source.items():
        copy = copies[name] = torch.empty_like(tensor)
        ctypes.memmove(copy.data_ptr(), tensor.data_ptr(), tensor.nbytes)
    done = time.monotonic()
    for name, tensor in source.items():  # again, into the same memory: the bytes alone, without new pages
        ctypes.memmove(copies[name].data_ptr(), tensor.data_ptr(), tensor.nbytes)
    return {"state": copies, "returned_at": started, "touched": time.monotonic() - done}, done

def in_use():  # the machine's anonymous and shared memory: every copy of the result, in any process
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":") for line in meminfo)
    return (int(fields["AnonPages"].split()[0]) + int(fields["Shmem"].split()[0])) * 1024

if MODE in ("ours", "old"):  # (imported once per kernel, not per launch: not part of ``total``)
    from notebook_launcher import notebook_launcher
machine = [in_use()] * 2  # (at the start, the most since)
if SAMPLED:
    import threading
    def sample():
        while machine[0] is not None:
            machine[1] = max(machine[1], in_use())
            time.sleep(0.0005)
    threading.Thread(target=sample, daemon=True).start()
bool((torch.zeros(8) == 0.0).all())  # (the check's first use, counted in no path)
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")
before, code_before = status_kb("VmRSS"), status_kb("RssFile")
started = time.monotonic()
if MODE == "memcpy":
    result, done = memcpy()
    started = result["returned_at"]
elif MODE == "queue":
    import torch.multiprocessing as mp
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[4])
    context = mp.get_context("fork")
    queue, taken = context.SimpleQueue(), context.Event()
    processes = mp.start_processes(queue_rank, args=(queue, taken), nprocs=2, join=False, start_method="fork")
    result = queue.get()
    value_at = time.monotonic()
    taken.set()
    while not processes.join():  # (a launcher returns once its processes are gone: Lightning's joins them first)
        pass
    done = time.monotonic()
else:
    result = notebook_launcher(returns_big, num_processes=2, device="cpu", display="text", results="rank0")
    done = time.monotonic()
state = result["state"]
right = len(state) == TENSORS and all(  # (reads every byte: the caller's peak counts the whole result)
    tensor.numel() == EACH and bool((tensor == float(i)).all()) for i, tensor in enumerate(state.values()))
kernel_peak_with_code = (status_kb("VmHWM") - before) * 1024
kernel_peak = kernel_peak_with_code - (status_kb("RssFile") - code_before) * 1024  # (code paged in: not the result)
machine_peak, machine[0] = (machine[1] - machine[0] if SAMPLED else None), None
rank_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print("RESULT " + json.dumps({"total": done - started, "transfer": done - result["returned_at"],
                              "touched": result.get("touched"), "kernel_peak": kernel_peak, "rank_peak": rank_peak,
                              "kernel_peak_with_code": kernel_peak_with_code,
                              "machine_peak": machine_peak,
                              "before_join": value_at - result["returned_at"] if MODE == "queue" else None,
                              "right": right}))
'''

MODES = ("ours", "old", "queue", "memcpy")


def measure(mode: str, size: int, trees: dict, runs_dir: str, port: int, kind: str, sampled: str) -> dict:
    tree = trees.get(mode, ROOT)
    env = {**os.environ, "PYTHONPATH": tree, "NOTEBOOK_LAUNCHER_RUNS_DIR": runs_dir}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(size), mode, str(TENSORS), str(port), kind, sampled],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tree)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (done.stderr.strip().splitlines() or [""])[-1][:100]
    return {"total": None, "transfer": None, "kernel_peak": None, "rank_peak": None, "right": f"exit {done.returncode}: {tail}"}


def spread(values, key: str, scale: float = 1.0) -> str:
    got = [value[key] / scale for value in values if value.get(key) is not None]
    return f"{median(got):.2f} ({min(got):.2f}-{max(got):.2f})" if got else "n/a"


def main(argv=None) -> int:
    from common import free_port

    parser = arguments(__doc__, "result_transfer")
    parser.add_argument("--baseline", default=BASELINE, help="git ref of the old tree (the pipe path)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", default="0.0625,1,2", help="sizes of rank 0's result in GiB, comma-separated")
    parser.add_argument("--copied", action="store_true", help="ours and old: tensors whose .cpu() is a copy (as "
                        "a GPU's is), so the rank holds the copy until it is written")
    parser.add_argument("--machine-memory", action="store_true", help="also the machine's peak of anonymous and "
                        "shared memory (every copy, in every process), sampled every 0.5 ms: not a timing run")
    options = parse(parser, argv, smoke={"reps": 1, "sizes": "0.01", "baseline": None})
    sizes = [int(float(gib) * 2**30) for gib in options.sizes.split(",")]
    modes = [mode for mode in MODES if mode != "old" or options.baseline]
    work = tempfile.mkdtemp(prefix="result_transfer-")
    old_tree = os.path.join(work, "old")
    if options.baseline:
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", old_tree, options.baseline],
                       check=True, capture_output=True)
    trees = {"old": old_tree}
    load_before = os.getloadavg()
    samples: dict = {(size, mode): [] for size in sizes for mode in modes}
    try:
        for rep in range(options.reps):
            for size in sizes:
                order = modes[rep % len(modes):] + modes[:rep % len(modes)]  # rotated: drift hits every mode alike
                for mode in order:
                    samples[size, mode].append(measure(mode, size, trees, os.path.join(work, "runs"), free_port(),
                                                       "copied" if options.copied else "cpu",
                                                       "machine" if options.machine_memory else "-"))
                    print(f"round {rep + 1}, {size / 2**20:g} MiB, {mode}: {samples[size, mode][-1]}",
                          file=sys.stderr, flush=True)
    finally:
        if options.baseline:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old_tree], capture_output=True)
        subprocess.run(["rm", "-rf", work])
    load_after = os.getloadavg()
    rows = []
    for size in sizes:  # (memcpy's second copy, into memory already touched: the bytes alone, no new pages)
        samples[size, "memcpy, touched"] = [{"total": value["touched"], "transfer": value["touched"], "right": True}
                                            for value in samples[size, "memcpy"] if value.get("touched") is not None]
        # (the queue's value in the parent before its processes are joined: the transfer alone, the exits left out)
        samples[size, "queue, before join"] = [{"total": None, "transfer": value["before_join"], "right": True}
                                               for value in samples[size, "queue"]
                                               if value.get("before_join") is not None]

    def transfer(size, mode):
        return median([value["transfer"] for value in samples[size, mode] if value.get("transfer") is not None])

    for (size, mode), values in samples.items():
        ratios = {other: ratio(transfer(size, mode), transfer(size, other))
                  for other in ("queue", "queue, before join", "memcpy", "memcpy, touched")}
        rows.append([f"{size / 2**20:g} MiB / {mode}", spread(values, "total"), spread(values, "transfer"),
                     *(f"{value:.2f}x" if value else "n/a" for value in ratios.values()),
                     spread(values, "kernel_peak", size), spread(values, "rank_peak", size),
                     spread(values, "machine_peak", size),
                     ", ".join(sorted({str(value["right"]) for value in values}))])
    rows.sort(key=lambda row: float(row[0].split()[0]))
    print(f"{options.reps} fresh processes each, interleaved; median (min-max); load average before "
          f"{load_before[0]:.2f}, after {load_after[0]:.2f}")
    print(table(["size / path", "total (s)", "transfer (s)", "/ queue", "/ queue before join", "/ memcpy",
                 "/ memcpy, touched",
                 "kernel peak (x size)", "rank peak (x size)", "machine peak (x size)", "bytes right"], rows))
    headline = {}
    for size in sizes:
        headline[f"{size / 2**20:g} MiB: ours / queue"] = ratio(transfer(size, "ours"), transfer(size, "queue"))
        headline[f"{size / 2**20:g} MiB: ours / queue before join"] = ratio(transfer(size, "ours"),
                                                                          transfer(size, "queue, before join"))
        headline[f"{size / 2**20:g} MiB: ours / memcpy"] = ratio(transfer(size, "ours"), transfer(size, "memcpy"))
    return finish(options, {
        "baseline": options.baseline, "reps": options.reps, "copied": options.copied, "load_before": load_before,
        "load_after": load_after, "samples": {f"{size}/{mode}": values for (size, mode), values in samples.items()}},
        headline)


if __name__ == "__main__":
    exit_with(main)
