"""A detached run against a foreground one: launch → first line of a rank, and launch → the call returns.

Run: ``.venv/bin/python benchmarks/detached_launch.py`` (about a minute; ``--reps 9 --hold 1``).

Both launch the same function on 2 CPU ranks (gloo, ``--start-method``, fork by default): it prints a line at once,
then holds ``--hold`` seconds and returns. Under fork the detached run's supervisor is a copy of this process; under
spawn (``--start-method spawn``) a fresh interpreter, which imports torch before its ranks start. Repetitions
alternate the two ways (the order rotating), so that background load hits both alike.

- ``first line``: from the call to the time the first line was written by a rank (its event's time:
  CLOCK_MONOTONIC, the same clock in every process of this machine). Foreground: seen by a display passed in;
  detached: read back on the run's socket after the call returned.
- ``return``: from the call to its return: the whole run in the foreground, the ranks started when detached
  (the notebook is free from then on).

Prints medians with their spread (min-max) and the ratios detached / foreground; writes
benchmarks/results/detached_launch.json. Every detached run is waited for; no process of it is left.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

from common import arguments, exit_with, finish, median, parse, table

from notebook_launcher import notebook_launcher
from notebook_launcher.detached_channel import Follower, connect


def hold(seconds):
    print("first line", flush=True)
    time.sleep(seconds)
    return seconds


class FirstLine:
    """A display that keeps the time of the first line a rank wrote."""

    def __init__(self):
        self.first = None

    def show(self, event):
        if event.kind == "stream" and self.first is None:
            self.first = event.time

    def note(self, text):
        pass

    def tick(self):
        pass

    def retarget(self, node_rank, ranks):
        pass


def foreground(seconds: float, start_method: str) -> dict:
    shown = FirstLine()
    started = time.monotonic()
    notebook_launcher(hold, args=(seconds,), num_processes=2, device="cpu", start_method=start_method, display=shown)
    return {"first line": shown.first - started, "return": time.monotonic() - started}


def detached(seconds: float, start_method: str) -> dict:
    started = time.monotonic()
    run = notebook_launcher(hold, args=(seconds,), num_processes=2, device="cpu", start_method=start_method,
                            display="text", detach=True)
    returned = time.monotonic() - started
    first, seen = [], threading.Event()

    def on_message(header, attachment):
        if "event" in header and header["event"][3] == "stream" and not first:
            first.append(header["event"][2])
            seen.set()

    connection = connect(run.run_dir)
    if connection is not None:
        Follower(connection, on_message, seen.set)
        seen.wait(120)
    run.result(timeout=120)
    return {"first line": first[0] - started if first else None, "return": returned}


def main(argv=None) -> int:
    parser = arguments(__doc__, "detached_launch")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--hold", type=float, default=1.0)
    parser.add_argument("--start-method", choices=("fork", "spawn"), default="fork")
    options = parse(parser, argv, smoke={"reps": 1, "hold": 0.1})
    os.environ.setdefault("NOTEBOOK_LAUNCHER_RUNS_DIR", tempfile.mkdtemp(prefix="detached-bench-"))
    ways = {"foreground": foreground, "detached": detached}
    samples = {way: [] for way in ways}
    for rep in range(options.reps + 1):  # the first: warm-up
        order = list(ways) if rep % 2 == 0 else list(reversed(ways))
        for way in order:
            measured = ways[way](options.hold, options.start_method)
            if rep:
                samples[way].append(measured)
    rows, summary = [], {}
    for way in ways:
        for what in ("first line", "return"):
            values = [sample[what] for sample in samples[way] if sample[what] is not None]
            summary[f"{way} {what}"] = median(values)
            rows.append([f"{way}: launch → {what}", f"{median(values) * 1000:.0f}",
                         f"{min(values) * 1000:.0f}-{max(values) * 1000:.0f}"])
    ratios = {what: summary[f"detached {what}"] / summary[f"foreground {what}"] for what in ("first line", "return")}
    print(table(["", "median ms", "spread ms"], rows))
    print(f"detached / foreground: first line {ratios['first line']:.2f}x, return {ratios['return']:.2f}x "
          f"({options.start_method}, hold {options.hold:g} s, {options.reps} reps, load {os.getloadavg()[0]:.1f})")
    return finish(options, {"samples": samples, "medians": summary, "ratios": ratios, "hold_s": options.hold,
                            "start_method": options.start_method, "reps": options.reps, "load": os.getloadavg()},
                  {f"detached / foreground, {what}": value for what, value in ratios.items()})


if __name__ == "__main__":
    exit_with(main)
