"""What watching FSDP2's collectives costs: one small FSDP2 training step on 2 CPU ranks (gloo), bare torch beside
our launched ranks, with debug mode off and on.

Run: ``.venv/bin/python benchmarks/functional_hooks.py`` (about a minute; ``--reps 5 --steps 10`` is shorter).

The step: forward, backward, ``clip_grad_norm_`` and SGD on a 4-layer MLP, each layer ``fully_shard``-ed. Its
collectives are FSDP2's all_gathers and reduce-scatters (``torch.distributed``'s, hooked by ``ops``) and the
gradient norm's functional all_reduce (a DTensor reduction: ``torch.ops._c10d_functional``, hooked by
``rank/functional.py``), each with its wait. Three ways, medians of ``--reps`` blocks of ``--steps`` steps (ms
per step on rank 0, spread min-max):

- off: our launched ranks with the watch and debug mode off (the hooks installed, passing each call through);
- watched: the same processes, every collective recorded for the hang watch (a launch's default);
- debug: the same processes, debug mode on (each collective checked first);
- bare: ``torch.multiprocessing`` fork workers, no hook at all, started after the launch (other processes: under
  load their figure moves more than the ratios of the three above, which run interleaved in one launch).

Writes benchmarks/results/functional_hooks.json (every block, medians, ratios, load average).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from common import arguments, exit_with, finish, free_port, parse, table

from notebook_launcher import last_run, notebook_launcher

WORLD = 2


def _model():
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _block(model, optimizer, steps: int) -> float:
    inputs = torch.randn(16, 64)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(steps):
        model(inputs).square().mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # a DTensor norm: a functional all_reduce
        optimizer.step()
        optimizer.zero_grad()
    return (time.perf_counter() - started) / steps * 1e3


def _switch(mode: str, watched) -> None:
    """Debug mode through ACCELERATE_DEBUG_MODE (the launch gives no ``debug=``); the watch off by taking the
    progress record out of the rank's context (the hooks then pass every call through)."""
    from notebook_launcher.rank import context

    os.environ["ACCELERATE_DEBUG_MODE"] = "1" if mode == "debug" else "0"
    if watched is not None:
        context.enter(dataclasses.replace(watched, progress=None) if mode == "off" else watched)


def blocks(reps: int, steps: int, modes=("off", "watched", "debug")) -> dict:
    """On every rank: {mode: [ms per step of each block]}, the modes in a rotating order from one repetition to
    the next, in the same processes."""
    from notebook_launcher.rank import context

    torch.set_num_threads(1)
    watched = context.current if context.current.progress is not None else None
    model, optimizer = _model()
    samples = {mode: [] for mode in modes}
    for mode in modes:  # warm-up, each way
        _switch(mode, watched)
        _block(model, optimizer, 2)
    for rep in range(reps):
        for mode in modes[rep % len(modes):] + modes[:rep % len(modes)]:
            _switch(mode, watched)
            samples[mode].append(_block(model, optimizer, steps))
    _switch("watched", watched)
    return samples


def _bare_worker(rank: int, port: int, reps: int, steps: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    samples = blocks(reps, steps, modes=("bare",))
    if rank == 0:
        torch.save(samples, os.path.join(out_dir, "samples.pt"))
    dist.barrier()
    dist.destroy_process_group()


def bare(reps: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as out_dir:
        torch_mp.start_processes(_bare_worker, args=(free_port(), reps, steps, out_dir), nprocs=WORLD,
                                 start_method="fork")
        return torch.load(os.path.join(out_dir, "samples.pt"))


def launched(reps: int, steps: int) -> dict:
    os.environ.pop("ACCELERATE_DEBUG_MODE", None)
    with contextlib.redirect_stdout(io.StringIO()):
        notebook_launcher(blocks, args=(reps, steps), num_processes=WORLD, device="cpu", timeout=600)
    return last_run().results[0]


def spread(values) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv=None) -> int:
    parser = arguments(__doc__, "functional_hooks")
    parser.add_argument("--reps", type=int, default=15, help="blocks per way")
    parser.add_argument("--steps", type=int, default=20, help="training steps per block")
    options = parse(parser, argv, smoke={"reps": 1, "steps": 2})
    load_at_start = os.getloadavg()
    samples = {**launched(options.reps, options.steps), **bare(options.reps, options.steps)}
    load_at_end = os.getloadavg()
    base = statistics.median(samples["off"])
    ratios = {mode: statistics.median(values) / base for mode, values in samples.items()}
    print(f"one FSDP2 step (4 x Linear(64, 64), clip_grad_norm_, SGD), 2 CPU ranks; median (min-max) of "
          f"{options.reps} blocks of {options.steps} steps, rank 0")
    print(table(["way", "ms per step", "/ off"], [[mode, spread(values), f"{ratios[mode]:.2f}x"]
                                                  for mode, values in samples.items()]))
    print(f"load average at start {load_at_start[0]:.2f}, at end {load_at_end[0]:.2f}")
    return finish(options, {"samples": samples, "ratios": ratios, "load_at_start": load_at_start,
                            "load_at_end": load_at_end, "reps": options.reps, "steps": options.steps},
                  {f"{mode} / off": ratios[mode] for mode in ratios if mode != "off"})


if __name__ == "__main__":
    exit_with(main)
