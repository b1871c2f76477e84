"""What debug mode costs per collective: a gather of 10 floats on 2 CPU ranks (gloo), debug off vs on.

Side by side in one run:
- ours: ``notebook_launcher.ops.gather`` in workers of ``notebook_launcher`` with ``debug=False`` / ``debug=True``;
- ours, raw: ``torch.distributed.all_reduce`` of 10 floats in our workers (wrapped: progress record, and the check
  in debug mode) against the same call in bare ``torch.multiprocessing`` workers (unwrapped);
- Accelerate: ``Accelerator.gather`` in bare ``torch.multiprocessing`` fork workers with ``ACCELERATE_DEBUG_MODE``
  off / on (Accelerate's check gathers every rank's shapes as pickled objects).

Run: ``.venv/bin/python benchmarks/debug_overhead.py``. Prints µs per call (median over ranks and repeats), the
debug-on / debug-off ratios, and writes benchmarks/results/debug_overhead.json. Aim: ours ≤ 1.5x.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from common import HERE, free_port, write_json

from notebook_launcher import last_run, notebook_launcher, ops

CALLS = 400
REPEATS = 5
WORLD = 2
RESULTS = os.path.join(HERE, "results", "debug_overhead.json")


def _timed(call, calls: int) -> float:
    for _ in range(20):
        call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls * 1e6


def ours_gather(calls: int) -> float:
    tensor = torch.arange(10.0)
    return _timed(lambda: ops.gather(tensor), calls)


def ours_raw_all_reduce(calls: int) -> float:
    tensor = torch.arange(10.0)
    return _timed(lambda: dist.all_reduce(tensor), calls)


def _bare_worker(rank: int, port: int, what: str, debug: bool, calls: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD), ACCELERATE_USE_CPU="true",
                      ACCELERATE_DEBUG_MODE="true" if debug else "false")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    tensor = torch.arange(10.0)
    if what == "accelerate":
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=True)
        micros = _timed(lambda: accelerator.gather(tensor), calls)
    else:
        micros = _timed(lambda: dist.all_reduce(tensor), calls)
    with open(os.path.join(out_dir, f"{rank}.txt"), "w") as out:
        out.write(str(micros))
    dist.barrier()
    dist.destroy_process_group()


def bare(what: str, debug: bool) -> list[float]:
    with tempfile.TemporaryDirectory() as out_dir:
        torch_mp.start_processes(_bare_worker, args=(free_port(), what, debug, CALLS, out_dir), nprocs=WORLD,
                                 start_method="fork")
        return [float(open(os.path.join(out_dir, f"{rank}.txt")).read()) for rank in range(WORLD)]


def ours(function, debug: bool) -> list[float]:
    with contextlib.redirect_stdout(io.StringIO()):
        notebook_launcher(function, args=(CALLS,), num_processes=WORLD, device="cpu", debug=debug)
    return list(last_run().results.values())


def main() -> None:
    torch.set_num_threads(1)
    cases = {
        "ours gather, debug off": lambda: ours(ours_gather, False),
        "ours gather, debug on": lambda: ours(ours_gather, True),
        "accelerate gather, debug off": lambda: bare("accelerate", False),
        "accelerate gather, debug on": lambda: bare("accelerate", True),
        "bare dist.all_reduce": lambda: bare("raw", False),
        "ours dist.all_reduce, debug off": lambda: ours(ours_raw_all_reduce, False),
        "ours dist.all_reduce, debug on": lambda: ours(ours_raw_all_reduce, True),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(REPEATS):  # interleaved, so load changes hit every case alike
        for name, run in cases.items():
            samples[name] += run()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"µs per call, 10 floats, {WORLD} CPU ranks (gloo), median of {REPEATS} runs x {WORLD} ranks x "
          f"{CALLS} calls")
    for name, value in medians.items():
        print(f"  {name:34s} {value:9.1f}")
    ratios = {
        "ours gather on/off": medians["ours gather, debug on"] / medians["ours gather, debug off"],
        "accelerate gather on/off": medians["accelerate gather, debug on"] / medians["accelerate gather, debug off"],
        "ours all_reduce on/off": medians["ours dist.all_reduce, debug on"] / medians["ours dist.all_reduce, debug off"],
        "ours all_reduce off / bare": medians["ours dist.all_reduce, debug off"] / medians["bare dist.all_reduce"],
        "accelerate debug on / ours debug on":
            medians["accelerate gather, debug on"] / medians["ours gather, debug on"],
    }
    for name, value in ratios.items():
        print(f"  {name:34s} {value:9.2f}x")
    print(f"aim: ours gather debug on/off <= 1.5x: {'met' if ratios['ours gather on/off'] <= 1.5 else 'NOT met'}")
    write_json(RESULTS, {"us_per_call_median": medians, "ratios": ratios, "samples": samples})
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
