"""How soon the stall watchdog speaks: time from the last progress of a run to its ``possible hang`` notice.

Rank 1 spins in its own code (no collective, no report) while rank 0 waits in ``all_reduce``; the last progress
is rank 0 entering that all_reduce (its progress record says when, on the monotonic clock the events use too).
The notice is due ``hang_warning`` seconds later; what follows it is the kernel's own latency: its loop's wait
(``monitor_interval``) and the 0.5 s it gives the ranks to dump their stacks. Also measured: how soon the
"cleared" notice follows the busy rank's return to the collective.

Run: ``.venv/bin/python benchmarks/hang_notice.py [--reps N]`` (default 5, about 5 s each). Writes
benchmarks/results/hang_notice.json. Aim: the notice within hang_warning + 1 s. The headline: last progress to
notice over hang_warning (1.00x: exactly on time; the aim is at most 1.50x).
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys
import time

from common import arguments, finish, parse

from notebook_launcher import last_run, notebook_launcher

HANG_WARNING = 2.0
BUSY_S = 3.5


def spin_then_reduce(busy_s: float, marks: str):
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        end = time.time() + busy_s
        while time.time() < end:
            pass
        with open(marks, "a") as out:
            out.write(f"back {time.monotonic()}\n")
    else:
        with open(marks, "a") as out:
            out.write(f"waits {time.monotonic()}\n")
    dist.all_reduce(torch.ones(1))


def once(marks: str) -> tuple[float, float]:
    if os.path.exists(marks):
        os.remove(marks)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        notebook_launcher(spin_then_reduce, args=(BUSY_S, marks), num_processes=2, device="cpu",
                          hang_warning=HANG_WARNING, display="text")
    times = dict(line.split() for line in open(marks).read().splitlines())
    notices = [event for event in last_run().events if event.kind == "hang_notice"]
    opened = next(event.time for event in notices if event.data["state"] == "open")
    cleared = next(event.time for event in notices if event.data["state"] == "cleared")
    return opened - float(times["waits"]), cleared - float(times["back"])


def main(argv=None) -> int:
    parser = arguments(__doc__, "hang_notice")
    parser.add_argument("--reps", type=int, default=5, help="runs (default 5)")
    args = parse(parser, argv, smoke={"reps": 1})
    repetitions = args.reps
    marks = os.path.join(os.path.dirname(os.path.abspath(args.output)), "hang_notice.marks")
    os.makedirs(os.path.dirname(marks), exist_ok=True)
    samples = [once(marks) for _ in range(repetitions)]
    os.remove(marks)
    to_notice = [opened for opened, _ in samples]
    to_clear = [cleared for _, cleared in samples]
    beyond = statistics.median(to_notice) - HANG_WARNING
    print(f"hang_warning={HANG_WARNING:g} s, {repetitions} runs, load {os.getloadavg()[0]:.2f}")
    print(f"  last progress -> notice: median {statistics.median(to_notice):.2f} s "
          f"(min {min(to_notice):.2f}, max {max(to_notice):.2f}): {beyond:.2f} s after hang_warning")
    print(f"  progress again -> cleared notice: median {statistics.median(to_clear):.2f} s "
          f"(min {min(to_clear):.2f}, max {max(to_clear):.2f})")
    met = beyond <= 1.0
    print(f"aim: notice within hang_warning + 1 s: {'met' if met else 'NOT met'}")
    return finish(args, {"hang_warning_s": HANG_WARNING, "to_notice_s": to_notice, "to_cleared_s": to_clear,
                         "beyond_hang_warning_s": beyond, "aim_met": met},
                  {"notice / hang_warning": statistics.median(to_notice) / HANG_WARNING})


if __name__ == "__main__":
    sys.exit(main())
