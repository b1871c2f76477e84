"""Time lost per out-of-memory retry, beyond the work itself, on 2 CPU ranks under a real memory cap.

Rank 1 needs 8 MB per sample and its workers may use 400 MB more than their start: batch 128 and 64 fail, 32 fits.
Measured from the run's own events:
- per retry, from the failing rank's report to every rank running again at the smaller size (stop, reap, fork,
  process group): the time lost to the restart itself;
- the whole run with its two retries against a run that starts at 32 directly, minus the work the failed tries
  did before failing: the time lost in total.
Run: ``.venv/bin/python benchmarks/oom_retry.py [--reps N]``. Aim: ≤ 0.2 s per retry. Writes
benchmarks/results/oom_retry.json; the headline: the run with two retries over the run starting at 32.
"""

import contextlib
import io
import statistics
import sys
import time

import torch
from common import arguments, finish, parse

from notebook_launcher import find_executable_batch_size, last_run, notebook_launcher
from notebook_launcher.rank.memory import memory_figures

MB = 2**20


def train(starting_batch_size):
    import torch.distributed as dist

    rank = dist.get_rank()

    @find_executable_batch_size(starting_batch_size=starting_batch_size)
    def inner(batch_size):
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
        extra = torch.ones(batch_size * (8 * MB if rank == 1 else 1024) // 4)
        model(torch.ones(batch_size, 16)).sum().backward()
        return batch_size + int(extra[0].item()) * 0

    return inner()


def base_address_space() -> int:
    return memory_figures()["virtual_bytes"]


def timed(starting_batch_size, limit):
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        size = notebook_launcher(train, args=(starting_batch_size,), num_processes=2, device="cpu",
                                 memory_limit=limit)
    return time.perf_counter() - started, size, last_run()


def restart_gaps(run) -> tuple[list[float], float]:
    """Per retry: failing rank's report → all ranks running again; and the failed tries' own work."""
    gaps, failed_work, attempt_start = [], 0.0, None
    events = run.events
    for index, event in enumerate(events):
        if event.kind == "batch_size" and attempt_start is None:
            attempt_start = event.time
        if event.kind == "failure" and event.data.get("oom_retry"):
            failed_work += event.time - attempt_start
            running_again = [e.time for e in events[index:] if e.kind == "status" and e.data.get("state") == "running"]
            gaps.append(running_again[1] - event.time)  # both ranks of the next attempt
            attempt_start = None
    return gaps, failed_work


def main(argv=None) -> int:
    parser = arguments(__doc__, "oom_retry")
    parser.add_argument("--reps", type=int, default=5, help="runs of each (default 5)")
    args = parse(parser, argv, smoke={"reps": 1})
    with contextlib.redirect_stdout(io.StringIO()):
        limit = notebook_launcher(base_address_space, num_processes=2, device="cpu") + 400 * MB
    direct, with_retries, gaps, lost = [], [], [], []
    for _ in range(args.reps):
        seconds, size, _ = timed(32, limit)
        assert size == 32
        direct.append(seconds)
        seconds, size, run = timed(128, limit)
        assert size == 32 and len(run.oom_retries) == 2, run.oom_retries
        with_retries.append(seconds)
        run_gaps, failed_work = restart_gaps(run)
        gaps += run_gaps
        lost.append((seconds - direct[-1] - failed_work) / 2)
    result = {
        "direct_at_32_s": statistics.median(direct), "with_two_retries_s": statistics.median(with_retries),
        "restart_gap_per_retry_s": statistics.median(gaps), "lost_per_retry_s": statistics.median(lost),
        "samples": {"direct": direct, "with_retries": with_retries, "gaps": gaps, "lost": lost},
    }
    print(f"2 CPU ranks, rank 1 out of memory at 128 and 64, success at 32 (median of {args.reps})")
    print(f"  run starting at 32:                      {result['direct_at_32_s']:.3f} s")
    print(f"  run starting at 128 (two retries):       {result['with_two_retries_s']:.3f} s")
    print(f"  restart per retry (report -> running):   {result['restart_gap_per_retry_s'] * 1000:.1f} ms")
    print(f"  time lost per retry beyond the work:     {result['lost_per_retry_s'] * 1000:.1f} ms  (aim <= 200 ms)")
    return finish(args, result, {"with two retries / direct": result["with_two_retries_s"] / result["direct_at_32_s"]})


if __name__ == "__main__":
    sys.exit(main())
