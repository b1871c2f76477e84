"""Runs the benchmarks, one after another, each in a process of its own.

    .venv/bin/python benchmarks/run.py                       # every benchmark (make bench)
    .venv/bin/python benchmarks/run.py launch_overhead       # one or more by name (make bench B=launch_overhead)
    .venv/bin/python benchmarks/run.py --smoke               # each at a tiny size: that it runs (make test's check)

Each prints its table and writes benchmarks/results/NAME.json (with ``--smoke``: results/smoke/NAME.json, not a
measurement); at the end, every benchmark's headline ratios and exit status. The exit status is the first
non-zero one of them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import HERE, fmt_ratio

NOT_BENCHMARKS = {"common.py", "run.py"}
BENCHMARKS = sorted(name[:-3] for name in os.listdir(HERE) if name.endswith(".py") and name not in NOT_BENCHMARKS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default all: {', '.join(BENCHMARKS)})")
    parser.add_argument("--smoke", action="store_true", help="each at a tiny size and one repetition")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"no benchmark {', '.join(unknown)}; there are {', '.join(BENCHMARKS)}")
    status, lines = 0, []
    for name in args.names or BENCHMARKS:
        print(f"== {name}", flush=True)
        code = subprocess.run([sys.executable, os.path.join(HERE, f"{name}.py"), *(["--smoke"] if args.smoke else [])],
                              cwd=os.path.dirname(HERE)).returncode
        status = status or code
        path = os.path.join(HERE, "results", *(["smoke"] if args.smoke else []), f"{name}.json")
        headline = {}
        if code == 0 and os.path.exists(path):
            with open(path) as results:
                headline = json.load(results).get("headline", {})
        figures = "; ".join(f"{label} {fmt_ratio(value)}" for label, value in headline.items())
        lines.append(f"{name}: {'ok' if code == 0 else f'exit {code}'}  {figures}")
    print("\n" + "\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
