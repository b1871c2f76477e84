"""What catching a collective at its function object costs, against rebinding the ``torch.distributed`` attribute
(the hooks before) and against no hook at all, on 2 CPU ranks (gloo).

Run: ``.venv/bin/python benchmarks/collective_hooks.py`` (under a minute; ``--reps 21 --sizes 10,256``).

One launch; in its ranks (where ``ops.install()`` has put the hooks on) every repetition times a block of
``all_reduce`` calls made three ways, the order rotating from one repetition to the next, so that background load
hits all alike:

- ``bare``: torch's own function, untouched (the copy the hooks call): no hook;
- ``attribute``: the hook called directly, as ``dist.all_reduce`` was when ``install()`` rebound the attribute;
- ``function``: ``all_reduce`` as imported before the launch (the same object as ``dist.all_reduce``): its
  trampoline, then the same hook: what every call goes through now.

Both with debug mode off (the hang watch's record only) and on (the agreement check too; a small tensor travels
with it). The figure per block is µs per call on rank 0; the table gives the median over repetitions, the spread
(min-max), and the ratios function / attribute and function / bare of the medians. Writes
benchmarks/results/collective_hooks.json; the headline: both ratios per case.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys

import torch
from common import arguments, finish, parse, table
from debug_overhead import _block  # µs per call of a block, the ranks in step
from torch.distributed import all_reduce  # bound before the launch, as in a notebook cell

from notebook_launcher import last_run, notebook_launcher

WAYS = ("bare", "attribute", "function")
CALLS = 300


def worker(sizes, reps):
    from notebook_launcher.rank import agreement
    from notebook_launcher.rank import collectives as ops

    torch.set_num_threads(1)
    bare = ops._raw["all_reduce"]
    assert bare is not all_reduce, "the launch did not intercept all_reduce"
    attribute = ops._wrapped("all_reduce", bare, *agreement.RAW_COLLECTIVES["all_reduce"])
    samples = {}
    for debug in (False, True):
        os.environ["ACCELERATE_DEBUG_MODE"] = "1" if debug else "0"
        for size in sizes:
            tensor = torch.ones(size)
            calls = {"bare": lambda: bare(tensor), "attribute": lambda: attribute(tensor),
                     "function": lambda: all_reduce(tensor)}
            for way in WAYS:  # warm-up
                _block(calls[way], 20)
            blocks = {way: [] for way in WAYS}
            for rep in range(reps):
                order = WAYS[rep % 3:] + WAYS[:rep % 3]
                for way in order:
                    blocks[way].append(_block(calls[way], CALLS))
            samples[f"debug {'on' if debug else 'off'}, {size} floats"] = blocks
    return samples


def trampoline_alone(reps: int) -> dict:
    """ns per call of a hook that returns at once, called directly (as the attribute hooks were) and through an
    intercepted function's trampoline, in this process (no collective: the trampoline's own cost, which the
    collectives' µs above hide in their noise). Blocks of 200,000 calls, alternating."""
    import timeit

    from notebook_launcher.rank import intercept

    def collective(tensor, op=None, group=None, async_op=False):  # the shape of torch's all_reduce
        return None

    def hook(*args, **kwargs):
        return None

    intercept.intercept(collective, lambda original: hook)
    tensor, calls, blocks = torch.ones(1), 200_000, {"attribute": [], "function": []}
    for rep in range(reps):
        for way in (("attribute", "function") if rep % 2 == 0 else ("function", "attribute")):
            call = hook if way == "attribute" else collective
            blocks[way].append(timeit.timeit(lambda: call(tensor), number=calls) / calls * 1e9)
    return blocks


def spread(values) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv=None) -> int:
    parser = arguments(__doc__, "collective_hooks")
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--sizes", default="10,256")
    options = parse(parser, argv, smoke={"reps": 1, "sizes": "10"})
    sizes = [int(size) for size in options.sizes.split(",")]
    load_at_start = os.getloadavg()
    os.environ.pop("ACCELERATE_DEBUG_MODE", None)
    with contextlib.redirect_stdout(io.StringIO()):
        notebook_launcher(worker, args=(sizes, options.reps), num_processes=2, device="cpu", timeout=600)
    samples = last_run().results[0]
    load_at_end = os.getloadavg()
    rows, ratios = [], {}
    for case, blocks in samples.items():
        medians = {way: statistics.median(blocks[way]) for way in WAYS}
        ratios[case] = {"function/attribute": medians["function"] / medians["attribute"],
                        "function/bare": medians["function"] / medians["bare"]}
        rows.append([case] + [spread(blocks[way]) for way in WAYS] +
                    [f"{ratios[case]['function/attribute']:.3f}x", f"{ratios[case]['function/bare']:.3f}x"])
    print(f"all_reduce on 2 CPU ranks, µs per call (median (min-max) of {options.reps} interleaved blocks of "
          f"{CALLS}, rank 0)")
    print(table(["case", "bare", "attribute (before)", "function (now)", "function/attribute", "function/bare"],
                rows))
    alone = trampoline_alone(options.reps)
    extra = statistics.median(alone["function"]) - statistics.median(alone["attribute"])
    print(f"\nthe call alone, ns (median (min-max) of {options.reps} blocks of 200,000, this process): hook called "
          f"directly {spread(alone['attribute'])}, through the trampoline {spread(alone['function'])}: "
          f"{extra:.0f} ns more a call")
    print(f"load average at start {load_at_start[0]:.2f}, at end {load_at_end[0]:.2f}")
    headline = {f"{case}: {pair}": value for case, pairs in ratios.items() for pair, value in pairs.items()}
    return finish(options, {"samples": samples, "trampoline_alone_ns": alone, "ratios": ratios,
                            "load_at_start": load_at_start, "load_at_end": load_at_end, "options": vars(options)},
                  headline)


if __name__ == "__main__":
    sys.exit(main())
