"""What debug mode costs per collective, over tensor sizes from 10 floats to 16 MB, on 2 CPU ranks (gloo).

Run: ``.venv/bin/python benchmarks/debug_overhead.py`` (about 1-2 minutes; ``--reps 5 --sizes 10,256,262144``).

Debug mode on and off are compared inside the same processes and the same process group: the workers are
launched without ``debug=``, so ``ACCELERATE_DEBUG_MODE`` decides at each call, and every rank switches it in
step. For each operation and size, every repetition times a block of calls with debug off and a block with it on,
the order alternating from one repetition to the next, so background load hits both alike. The figure per block
is µs per call on rank 0 (the ranks wait for each other in each call); the table gives the median over
repetitions with the spread (min-max), and the on / off ratio of the medians.

- ours: ``notebook_launcher.ops.gather``, ``torch.distributed.all_reduce`` (the raw collective, which our
  workers check in debug mode), ``notebook_launcher.ops.broadcast``;
- Accelerate, beside it: ``accelerate.utils.gather``, ``reduce`` (an all_reduce), ``broadcast`` in bare
  ``torch.multiprocessing`` fork workers, debug mode switched through ``PartialState().debug`` (Accelerate's
  check gathers every rank's shapes as pickled objects).

Aims for ours: on / off <= 1.3x for tensors up to 1 KB, <= 1.1x at 1 MB. Writes
benchmarks/results/debug_overhead.json (every block, medians, ratios, load average).
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from common import arguments, finish, free_port, parse, table

from notebook_launcher import last_run, notebook_launcher

WORLD = 2
SIZES = [10, 256, 16_384, 262_144, 4_194_304]  # float32 elements: 40 B, 1 KB, 64 KB, 1 MB, 16 MB
OPERATIONS = ("gather", "all_reduce", "broadcast")
BLOCK_S = 0.05  # each block runs about this long (at least 5 calls, at most 400)
AIMS = {40: 1.3, 1024: 1.3, 1 << 20: 1.1}  # bytes -> on / off at most


def _calls(size: int) -> int:
    return max(5, min(400, int(BLOCK_S / (30e-6 + size * 4 / 1e9))))


def _switch_ours(on: bool) -> None:
    os.environ["ACCELERATE_DEBUG_MODE"] = "1" if on else "0"


def _block(call, calls: int) -> float:
    dist.barrier()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - started
    return elapsed / calls * 1e6


def _sweep(make_calls, switch, sizes, reps: int) -> dict:
    """On every rank: {op: {size: {"off": [µs...], "on": [µs...]}}}, blocks alternating off/on."""
    torch.set_num_threads(1)
    samples = {}
    for operation in OPERATIONS:
        for size in sizes:
            call = make_calls(operation, size)
            calls = _calls(size)
            for mode in (False, True):  # warm-up, both ways
                switch(mode)
                _block(call, max(2, calls // 10))
            blocks = {"off": [], "on": []}
            for rep in range(reps):
                for on in ((False, True) if rep % 2 == 0 else (True, False)):
                    switch(on)
                    blocks["on" if on else "off"].append(_block(call, calls))
            samples.setdefault(operation, {})[size] = blocks
    switch(False)
    return samples


def _ours_calls(operation: str, size: int):
    from notebook_launcher.rank import collectives as ops

    tensor = torch.arange(size, dtype=torch.float32)
    if operation == "gather":
        return lambda: ops.gather(tensor)
    if operation == "all_reduce":
        return lambda: dist.all_reduce(tensor)
    return lambda: ops.broadcast(tensor, from_process=0)


def ours_worker(sizes, reps):
    return _sweep(_ours_calls, _switch_ours, sizes, reps)


def _accelerate_worker(rank: int, port: int, sizes, reps: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD), ACCELERATE_USE_CPU="true",
                      ACCELERATE_DEBUG_MODE="false")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from accelerate import PartialState
    from accelerate.utils import broadcast, gather, reduce

    state = PartialState(cpu=True)

    def switch(on: bool) -> None:
        state.debug = on

    def make_calls(operation: str, size: int):
        tensor = torch.arange(size, dtype=torch.float32)
        if operation == "gather":
            return lambda: gather(tensor)
        if operation == "all_reduce":
            return lambda: reduce(tensor)
        return lambda: broadcast(tensor, from_process=0)

    samples = _sweep(make_calls, switch, sizes, reps)
    if rank == 0:
        torch.save(samples, os.path.join(out_dir, "samples.pt"))
    dist.barrier()
    dist.destroy_process_group()


def accelerate_sweep(sizes, reps: int) -> dict:
    with tempfile.TemporaryDirectory() as out_dir:
        torch_mp.start_processes(_accelerate_worker, args=(free_port(), sizes, reps, out_dir), nprocs=WORLD,
                                 start_method="fork")
        return torch.load(os.path.join(out_dir, "samples.pt"))


def ours_sweep(sizes, reps: int) -> dict:
    os.environ.pop("ACCELERATE_DEBUG_MODE", None)
    with contextlib.redirect_stdout(io.StringIO()):
        notebook_launcher(ours_worker, args=(sizes, reps), num_processes=WORLD, device="cpu", timeout=600)
    return last_run().results[0]


def size_text(size: int) -> str:
    nbytes = size * 4
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{size} floats"


def spread(values) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main(argv=None) -> int:
    parser = arguments(__doc__, "debug_overhead")
    parser.add_argument("--reps", type=int, default=7, help="blocks off and on per operation and size")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="float32 elements, comma-separated")
    parser.add_argument("--skip-accelerate", action="store_true")
    options = parse(parser, argv, smoke={"reps": 1, "sizes": "10", "skip_accelerate": True})
    sizes = [int(size) for size in options.sizes.split(",")]
    load_at_start = os.getloadavg()
    results = {"ours": ours_sweep(sizes, options.reps)}
    if not options.skip_accelerate:
        results["accelerate"] = accelerate_sweep(sizes, options.reps)
    load_at_end = os.getloadavg()

    rows, ratios, verdicts = [], {}, []
    for operation in OPERATIONS:
        for size in sizes:
            ours = results["ours"][operation][size]
            ratio = statistics.median(ours["on"]) / statistics.median(ours["off"])
            ratios[f"ours {operation} {size}"] = ratio
            row = [f"{operation}, {size_text(size)}", spread(ours["off"]), spread(ours["on"]), f"{ratio:.2f}x"]
            if "accelerate" in results:
                theirs = results["accelerate"][operation][size]
                accelerate_ratio = statistics.median(theirs["on"]) / statistics.median(theirs["off"])
                ratios[f"accelerate {operation} {size}"] = accelerate_ratio
                row += [spread(theirs["off"]), spread(theirs["on"]), f"{accelerate_ratio:.2f}x"]
            rows.append(row)
            aim = AIMS.get(size * 4)
            if aim is not None:
                verdicts.append(f"ours {operation}, {size_text(size)}: on / off {ratio:.2f}x, aim <= {aim}x: "
                                f"{'met' if ratio <= aim else 'NOT met'}")
    header = ["2 CPU ranks, µs per call", "ours off", "ours on", "on/off"]
    if "accelerate" in results:
        header += ["Accelerate off", "Accelerate on", "on/off"]
    print(f"median (min-max) of {options.reps} interleaved blocks per case, rank 0")
    print(table(header, rows))
    print()
    print("\n".join(verdicts))
    print(f"load average at start {load_at_start[0]:.2f}, at end {load_at_end[0]:.2f}")
    return finish(options, {"samples": results, "ratios": ratios, "verdicts": verdicts, "load_at_start": load_at_start,
                            "load_at_end": load_at_end, "options": vars(options)},
                  {f"{label} on/off": value for label, value in ratios.items()})


if __name__ == "__main__":
    sys.exit(main())
