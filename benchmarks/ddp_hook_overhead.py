"""What recording DDP's collectives costs per training step: plain DDP vs DDP watched by ``ddp_watch``.

A small model (Linear(256, 256) x 3 with ReLUs, batch 32, SGD) on 2 CPU ranks (gloo), in workers of
``notebook_launcher``. Each rank builds one DDP model and trains it in blocks of steps that alternate between
plain (the model's watch taken off: torch's DDP as it is, plus the one dictionary look-up of our patched
``_post_forward``) and watched (the record updated at every forward and backward, as in any launch). One model
for both: two instances of the same model differ by a few percent from their memory layout alone. The blocks
alternate in the same processes, which one goes first too, so load changes hit both alike; a block's time per
step is its total over its steps.

Run: ``.venv/bin/python benchmarks/ddp_hook_overhead.py [launches]``. Prints µs per step (median over blocks,
ranks and launches), the watched / plain ratio (median and spread over the block pairs), the watch's own work
measured alone in this process (µs per step, no DDP or gloo: far less noise than a 2-rank step), and writes
benchmarks/results/ddp_hook_overhead.json. Aim: ratio ≤ 1.02.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys
import time

import torch
from common import HERE, write_json

from notebook_launcher import last_run, notebook_launcher

LAUNCHES = 3
BLOCKS = 30  # block pairs per launch
STEPS = 40  # steps per block
WARMUP = 4  # blocks (half plain, half watched) before the measured ones
WORLD = 2
RESULTS = os.path.join(HERE, "results", "ddp_hook_overhead.json")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                               torch.nn.ReLU(), torch.nn.Linear(256, 256))


def _pairs(blocks: int, steps: int) -> list[tuple[float, float]]:
    """In a worker: (plain, watched) µs per step for each block pair."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from notebook_launcher import ddp_watch

    record = ddp_watch._progress
    model = DistributedDataParallel(_model())
    watch = model.__dict__[ddp_watch._ATTRIBUTE]
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(32, 256, generator=torch.Generator().manual_seed(dist.get_rank()))

    def block(watched: bool) -> float:
        if watched:
            model.__dict__[ddp_watch._ATTRIBUTE] = watch
        else:
            model.__dict__.pop(ddp_watch._ATTRIBUTE, None)
        dist.barrier()  # both ranks start the block together
        started = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            model(inputs).square().mean().backward()
            optimizer.step()
        return (time.perf_counter() - started) / steps * 1e6

    for watched in (False, True):
        for _ in range(WARMUP // 2):
            block(watched)
    pairs = []
    for index in range(blocks):
        first = index % 2 == 0  # alternate which goes first
        times = {first: block(first), not first: block(not first)}
        pairs.append((times[False], times[True]))
    seen = record.read()  # only the watched blocks counted
    assert seen["operation"] == "DDP gradient all_reduce" and seen["step"] == (WARMUP // 2 + blocks) * steps
    return pairs


def mechanism_alone(calls: int = 3000, repeats: int = 7) -> dict:
    """µs per step of the watch's own work, without DDP or gloo: a Linear(64, 64) forward and backward in this
    process, bare vs with what a watched DDP model adds (the output's hook, the record, the two callbacks)."""
    import tempfile
    import timeit

    from notebook_launcher import ddp_watch
    from notebook_launcher.progress_record import ProgressRecord

    class Model:  # what the watch reads of a DDP model
        require_backward_grad_sync = True

    layer, inputs = torch.nn.Linear(64, 64), torch.randn(8, 64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a worker
    with tempfile.TemporaryDirectory() as directory:
        record = ProgressRecord(os.path.join(directory, "record"), create=True)
        ddp_watch._progress, watch, model = record, ddp_watch._Watch(layer), Model()

        def bare():
            layer(inputs).sum().backward()

        def watched():
            output = layer(inputs)
            watch.after_forward(model, output)
            output.sum().backward()

        best = {name: min(timeit.repeat(case, number=calls, repeat=repeats)) / calls * 1e6
                for name, case in (("bare", bare), ("watched", watched), ("bare again", bare))}
        assert record.read()["step"] == calls * repeats
        ddp_watch._progress = None
        record.close()
    torch.set_num_threads(threads)
    best["added"] = best["watched"] - min(best["bare"], best["bare again"])
    return best


def main() -> None:
    launches = int(sys.argv[1]) if len(sys.argv) > 1 else LAUNCHES
    os.environ.pop("NOTEBOOK_LAUNCHER_DDP_WATCH", None)
    pairs = []
    for _ in range(launches):
        with contextlib.redirect_stdout(io.StringIO()):
            notebook_launcher(_pairs, args=(BLOCKS, STEPS), num_processes=WORLD, device="cpu")
        for rank_pairs in last_run().results.values():
            pairs += rank_pairs
    plain = statistics.median(p for p, _ in pairs)
    watched = statistics.median(w for _, w in pairs)
    ratios = sorted(w / p for p, w in pairs)
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"µs per step, Linear(256,256)x3, batch 32, {WORLD} CPU ranks (gloo): {launches} launches x "
          f"{BLOCKS} block pairs x {STEPS} steps, per rank")
    print(f"  plain DDP             {plain:9.1f}")
    print(f"  DDP watched (ours)    {watched:9.1f}")
    print(f"  ratio of the medians  {watched / plain:9.3f}x")
    print(f"  ratio per block pair  median {statistics.median(ratios):.3f}x, quartiles {quartiles[0]:.3f}x-"
          f"{quartiles[2]:.3f}x, min {ratios[0]:.3f}x, max {ratios[-1]:.3f}x")
    alone = mechanism_alone()
    print(f"  the watch's own work alone (no DDP, no gloo): {alone['added']:.1f} µs per step "
          f"({alone['added'] / plain * 100:.2f} % of the plain DDP step above)")
    aim = statistics.median(ratios) <= 1.02
    print(f"aim: watched / plain <= 1.02: {'met' if aim else 'NOT met'}")
    write_json(RESULTS, {"us_per_step_median": {"plain": plain, "watched": watched},
                         "ratio_of_medians": watched / plain, "ratio_per_pair_median": statistics.median(ratios),
                         "ratio_quartiles": [quartiles[0], quartiles[2]], "alone_us": alone, "pairs": pairs})
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
