"""Debug mode never changes a result or an error: every collective, with and without it, gives the same values
(bit for bit; every NaN counts as one value) and raises the same exception (type and message), over ops,
dtypes, groups and bad arguments. Real launches of 2 and 3 ranks on gloo, every case of a mode in one launch.

The one difference debug mode is for: ranks that disagree on a call's shapes, dtypes or operation raise
``DistributedOperationException`` on every rank. Without debug mode such a call is undefined on gloo (one rank
may abort, another receive garbage), so those cases run in debug mode only (``disagreeing_cases``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from notebook_launcher import RankFailedError, last_run, notebook_launcher, ops

pytestmark = pytest.mark.processes

R = dist.ReduceOp
REDUCE_OPS = {"SUM": R.SUM, "PRODUCT": R.PRODUCT, "MAX": R.MAX, "MIN": R.MIN, "AVG": R.AVG, "BAND": R.BAND,
              "BOR": R.BOR, "BXOR": R.BXOR}
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool, torch.complex64, torch.complex128)
_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e16, 1.0, -1e16, 0.1, 1 / 3]  # order shows in 3-rank sums


@pytest.fixture(autouse=True)
def no_debug_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    monkeypatch.delenv("ACCELERATE_CONFIG_FILE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def values(dtype, rank: int, scale: int = 1) -> torch.Tensor:
    """Ten values per rank, in a (2, 5) tensor, placed differently on each rank: NaN against a number, zeros of
    both signs, infinities, sums whose order shows; integers that overflow; both booleans."""
    if dtype.is_floating_point or dtype.is_complex:
        real = torch.tensor(_FLOATS * scale, dtype=torch.float64).roll(rank) * (1 + 0.25 * rank)
        if dtype.is_complex:
            real = torch.complex(real, real.roll(3))
        return real.to(dtype).view(2, 5 * scale)
    if dtype == torch.bool:
        return torch.tensor([rank == 0, True, False, rank % 2 == 1, rank > 1] * 2 * scale).view(2, 5 * scale)
    wide = torch.tensor([rank + 1, -rank - 1, 127, -128, 100 * (rank + 1), 2**40 + rank, 0, 1, -1, 3 * rank] * scale)
    return wide.to(dtype).view(2, 5 * scale)


def encoded(value):
    """A value as plain data to compare bit for bit: a tensor's dtype, shape and bytes (NaNs made one NaN)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().contiguous()
        if tensor.is_complex():
            tensor = torch.view_as_real(tensor)
        if tensor.is_floating_point():
            tensor = torch.where(torch.isnan(tensor), torch.full_like(tensor, math.nan), tensor)
        return [str(value.dtype), list(value.shape), tensor.reshape(-1).view(torch.uint8).numpy().tobytes().hex()]
    if isinstance(value, (list, tuple)):
        return [encoded(item) for item in value]
    if isinstance(value, dict):
        return {str(key): encoded(item) for key, item in value.items()}
    return repr(value)


def outcome(call):
    """``call()``'s result as data, or the type and message of what it raised (addresses taken out)."""
    try:
        return ["ok", encoded(call())]
    except Exception as error:  # noqa: BLE001 - every exception is what is compared
        message = re.sub(r"\[F\d+ [\d:.]+ ", "[F", str(error))  # (the time in a message of gloo's)
        return ["raised", type(error).__name__, re.sub(r"0x[0-9a-f]+", "0x?", message)]


# -- the cases: each a name and a call that returns what it changed ------------------------------------------------
def reduced(op, tensor, **kwargs):
    dist.all_reduce(tensor, op=op, **kwargs)
    return tensor


def strided(tensor):
    """A non-contiguous view (its transpose) of a copy of ``tensor``: the view and its base come back."""
    base = tensor.clone()
    return base, base.t()


def collective_cases(rank: int, world: int, group, group_ranks: list[int]):
    """The cases on one group (None: the world). Ranks outside the group call them too (a no-op in torch).

    The barrier comes first, before any case that raises: gloo's barrier waits for every operation of its group
    still held by one of its threads, and a failed one that a thread has not let go of yet (it raised in its
    case already) raises again in the barrier, in the plain run or the debug run, as that thread happens to be
    scheduled."""
    cases = {"barrier": lambda: dist.barrier(group=group)}
    for dtype in DTYPES:
        cases.update(cases_of_dtype(dtype, rank, group, group_ranks))
    for dtype in (torch.float32, torch.int64):  # larger than what travels with debug mode's check
        for name, op in REDUCE_OPS.items():
            cases[f"all_reduce {name} {dtype} large"] = functools.partial(
                lambda op, dtype: reduced(op, values(dtype, rank, scale=40), group=group), op, dtype)
    size, first, last = len(group_ranks), group_ranks[0], group_ranks[-1]
    cases["all_gather_object"] = lambda: (dist.all_gather_object(out := [None] * size, {"r": rank}, group=group), out)
    cases["broadcast_object_list"] = lambda: (
        dist.broadcast_object_list(out := [rank, "x" * rank], src=last, group=group), out)
    cases["gather_object"] = lambda: (
        dist.gather_object(rank, out := [None] * size if rank == first else None, dst=first, group=group), out)
    cases["scatter_object_list"] = lambda: (
        dist.scatter_object_list(out := [None], list(range(size)) if rank == first else None, src=first,
                                 group=group), out)
    where = "world" if group is None else f"subgroup {group_ranks}"
    return {f"{name} ({where})": call for name, call in cases.items()}


def cases_of_dtype(dtype, rank: int, group, group_ranks: list[int]):
    """Every tensor collective on tensors of ``dtype``."""
    size, first, last = len(group_ranks), group_ranks[0], group_ranks[-1]
    d = str(dtype).replace("torch.", "")

    def mine():
        return values(dtype, rank)

    def empty(rows=2):  # (zeros: a rank outside the group leaves it as it is)
        return torch.zeros(rows, 5, dtype=dtype)

    cases = {}
    for name, op in REDUCE_OPS.items():
        cases[f"all_reduce {name} {d}"] = functools.partial(lambda op: reduced(op, mine(), group=group), op)
        cases[f"all_reduce {name} {d} strided"] = functools.partial(
            lambda op: (lambda pair: (reduced(op, pair[1], group=group), pair[0]))(strided(mine())), op)
    for source in sorted({first, last}):
        cases[f"broadcast from {source} {d}"] = functools.partial(
            lambda source: (dist.broadcast(tensor := mine(), src=source, group=group), tensor), source)
        cases[f"broadcast from {source} {d} strided"] = functools.partial(
            lambda source: (lambda pair: (dist.broadcast(pair[1], src=source, group=group), pair[0]))(
                strided(mine())), source)
    cases[f"all_gather {d}"] = lambda: (
        dist.all_gather(out := [empty() for _ in range(size)], mine(), group=group), out)
    cases[f"all_gather_into_tensor {d}"] = lambda: (
        dist.all_gather_into_tensor(out := empty(2 * size), mine(), group=group), out)
    cases[f"reduce_scatter {d}"] = lambda: (
        dist.reduce_scatter(out := empty(), [mine() for _ in range(size)], group=group), out)
    cases[f"reduce_scatter_tensor {d}"] = lambda: (
        dist.reduce_scatter_tensor(out := empty(1), mine().repeat(size, 1)[:size], group=group), out)
    cases[f"all_to_all {d}"] = lambda: (
        dist.all_to_all(out := [empty() for _ in range(size)], [mine() for _ in range(size)], group=group), out)
    cases[f"all_to_all_single {d}"] = lambda: (
        dist.all_to_all_single(out := empty(2 * size), mine().repeat(size, 1), group=group), out)
    for name in ("SUM", "MAX"):
        cases[f"reduce {name} to {last} {d}"] = functools.partial(
            lambda name: (dist.reduce(tensor := mine(), dst=last, op=REDUCE_OPS[name], group=group), tensor), name)
    if not dtype.is_complex:  # (complex: torch raises on the destination only; the others' sends are undefined)
        cases[f"gather to {first} {d}"] = lambda: (
            dist.gather(mine(), out := [empty() for _ in range(size)] if rank == first else None, dst=first,
                        group=group), out)
    cases[f"scatter from {last} {d}"] = lambda: (
        dist.scatter(out := empty(), [torch.full((2, 5), i).to(dtype) for i in range(size)] if rank == last
                     else None, src=last, group=group), out)
    return cases


def public_op_cases(rank: int, world: int):
    """notebook_launcher.ops, whose gather and broadcast debug mode finishes from the check's carried tensors."""
    cases = {}
    for dtype in DTYPES:
        d = str(dtype).replace("torch.", "")
        cases[f"ops.gather {d}"] = lambda dtype=dtype: ops.gather(values(dtype, rank))
        for source in (0, world - 1):
            cases[f"ops.broadcast from {source} {d}"] = lambda dtype=dtype, source=source: ops.broadcast(
                values(dtype, rank), from_process=source)
        for reduction in ("sum", "mean", "max", "min"):
            cases[f"ops.reduce {reduction} {d}"] = lambda dtype=dtype, reduction=reduction: ops.reduce(
                values(dtype, rank), reduction)
    cases["ops.gather_object"] = lambda: ops.gather_object([rank, None])
    cases["ops.broadcast_object_list"] = lambda: ops.broadcast_object_list([rank], from_process=world - 1)
    cases["ops.pad_across_processes"] = lambda: ops.pad_across_processes(torch.ones(rank + 1), pad_index=math.nan)
    return cases


def bad_argument_cases(rank: int, world: int):
    """Calls torch refuses on every rank alike: its own exception, debug mode or not."""
    t = functools.partial(torch.ones, 2, 3)
    return {
        "broadcast src out of range": lambda: dist.broadcast(t(), src=7),
        "broadcast src -1": lambda: dist.broadcast(t(), src=-1),
        "ops.broadcast from_process out of range": lambda: ops.broadcast(t(), from_process=7),
        "reduce dst out of range": lambda: dist.reduce(t(), dst=7),
        "gather dst out of range": lambda: dist.gather(t(), dst=7),
        "scatter src out of range": lambda: dist.scatter(t(), src=7),
        "broadcast_object_list src out of range": lambda: dist.broadcast_object_list([1], src=7),
        **{f"group='junk' {name}": functools.partial(call, group="junk") for name, call in {
            "all_reduce": functools.partial(dist.all_reduce, t()),
            "broadcast": functools.partial(dist.broadcast, t(), src=0),
            "all_gather": functools.partial(dist.all_gather, [t() for _ in range(world)], t()),
            "all_gather_into_tensor": functools.partial(dist.all_gather_into_tensor, torch.ones(2 * world, 3), t()),
            "reduce": functools.partial(dist.reduce, t(), dst=0),
            "barrier": dist.barrier,
            "all_gather_object": functools.partial(dist.all_gather_object, [None] * world, 1),
            "broadcast_object_list": functools.partial(dist.broadcast_object_list, [1], src=0),
        }.items()},
        **{f"complex {name}": functools.partial(reduced, op, t().to(torch.complex64))
           for name, op in REDUCE_OPS.items() if name not in ("SUM", "AVG")},
        "BAND on floats": functools.partial(reduced, R.BAND, t()),
        "op given as a string": functools.partial(reduced, "max", t()),
        "not a tensor": lambda: dist.all_reduce([1.0, 2.0]),
        "all_gather_into_tensor, output of another dtype": lambda: dist.all_gather_into_tensor(
            torch.empty(2 * world, 3, dtype=torch.float64), t()),
        "all_gather_into_tensor, output too small": lambda: dist.all_gather_into_tensor(torch.empty(1, 3), t()),
        "all_gather, list of another dtype": lambda: dist.all_gather([t().double() for _ in range(world)], t()),
        "all_gather, list one too long": lambda: dist.all_gather([t() for _ in range(world + 1)], t()),
        "reduce_scatter_tensor, input of another dtype": lambda: dist.reduce_scatter_tensor(
            torch.empty(2, 3), torch.ones(2 * world, 3, dtype=torch.float64)),
        "all_reduce async, waited": lambda: (lambda tensor: (dist.all_reduce(tensor, async_op=True).wait(), tensor))(
            values(torch.float32, rank)),
        "ops.reduce unknown reduction": lambda: ops.reduce(t(), "median"),
    }


def disagreeing_cases(rank: int, world: int):
    """Debug mode's purpose, run in debug mode only: ranks that disagree raise DistributedOperationException."""
    return {
        "all_reduce of another dtype on rank 0": lambda: dist.all_reduce(torch.ones(3, dtype=torch.float64 if rank
                                                                                    == 0 else torch.float32)),
        "broadcast of another shape on rank 0": lambda: dist.broadcast(torch.ones(3 if rank == 0 else 4), src=0),
        "all_reduce with another op on rank 0": lambda: dist.all_reduce(torch.ones(3), op=R.MAX if rank == 0
                                                                        else R.SUM),
    }


def every_case(debug: bool):
    """Every case, in one launch; returns {case: outcome}. (A launched function: ``debug`` is the launch's.)"""
    rank, world = dist.get_rank(), dist.get_world_size()
    subgroup_ranks = [world - 2, world - 1]  # 3 ranks: rank 0 is outside it
    subgroup = dist.new_group(subgroup_ranks)
    cases = {**collective_cases(rank, world, None, list(range(world))),
             **collective_cases(rank, world, subgroup, subgroup_ranks),
             **public_op_cases(rank, world), **bad_argument_cases(rank, world)}
    if debug:
        cases.update(disagreeing_cases(rank, world))
    return {name: outcome(call) for name, call in cases.items()}


@pytest.mark.parametrize("num_processes", [2, 3])
def test_every_collective_gives_the_same_values_and_errors_with_and_without_debug_mode(num_processes):
    notebook_launcher(every_case, args=(False,), num_processes=num_processes, device="cpu", debug=False,
                      display="text", timeout=120)
    plain = last_run().results
    notebook_launcher(every_case, args=(True,), num_processes=num_processes, device="cpu", debug=True,
                      display="text", timeout=120)
    debug = last_run().results
    disagreeing = set(disagreeing_cases(0, num_processes))
    for rank in range(num_processes):
        for name in disagreeing:  # the one difference: debug mode says the ranks disagree, on every rank
            assert debug[rank].pop(name)[:2] == ["raised", "DistributedOperationException"], name
        assert debug[rank].keys() == plain[rank].keys()
        differences = {name: (plain[rank][name], debug[rank][name]) for name in plain[rank]
                       if plain[rank][name] != debug[rank][name]}
        assert not differences, f"rank {rank}: {sorted(differences)} {json.dumps(differences)[:3000]}"
    # the cases are what they say: values compared, and torch's own errors among them
    outcomes = plain[0]
    raised = {name: result[1] for name, result in outcomes.items() if result[0] == "raised"}
    assert raised["broadcast src out of range"] == "RuntimeError"
    assert raised["group='junk' all_reduce"] == "ValueError"
    assert raised["complex MAX"] == "ValueError"
    assert raised["all_gather_into_tensor, output of another dtype"] == "RuntimeError"
    print(f"{len(outcomes)} cases, {len(outcomes) - len(raised)} giving values, {len(raised)} raising")


# -- whatever stands in a collective's place before notebook_launcher is imported ----------------------------------
REPLACED_BEFORE_IMPORT = textwrap.dedent('''
    import functools, json, sys
    import torch, torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    torch_all_reduce = c10d.all_reduce
    if sys.argv[1] == "wrapper":
        def all_reduce(tensor, *args, **kwargs):  # the user's own: every sum counted twice
            work = torch_all_reduce(tensor, *args, **kwargs)
            tensor.mul_(2)
            return work
        c10d.all_reduce = all_reduce
    elif sys.argv[1] == "partial":
        c10d.all_reduce = functools.partial(torch_all_reduce)
    else:  # an object that hides torch's function, in both of its places
        class Opaque:
            def __call__(self, *args, **kwargs):
                return torch_all_reduce(*args, **kwargs)
        c10d.all_reduce = dist.all_reduce = Opaque()

    from notebook_launcher import check_trigger, last_run, notebook_launcher, ops

    def function(debug):
        rank = dist.get_rank()
        tensor = torch.ones(1) * (rank + 1)
        c10d.all_reduce(tensor)
        results = {"c10d.all_reduce": tensor.item(), "ops.reduce": ops.reduce(torch.ones(1)).item(),
                   "check_trigger": check_trigger()}
        if debug and sys.argv[1] != "object":  # ranks that disagree: caught only where the call is watched
            try:
                dist.all_reduce(torch.ones(2 + rank))
            except Exception as error:
                results["disagreeing dist.all_reduce"] = type(error).__name__
        return results

    for debug in (False, True):
        notebook_launcher(function, args=(debug,), num_processes=2, device="cpu", debug=debug, display="text")
        print("RESULTS", json.dumps(last_run().results))
''')


def run_replaced(tmp_path, kind: str) -> subprocess.CompletedProcess:
    """A fresh Python that replaces c10d's all_reduce, then imports notebook_launcher and launches (stopped whole
    if it overruns)."""
    script = tmp_path / "replaced.py"
    script.write_text(REPLACED_BEFORE_IMPORT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(__file__)),
                                                        os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, str(script), kind], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=120)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # its ranks too, whatever happened
        except ProcessLookupError:
            pass
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, output)


@pytest.mark.parametrize("kind", ["wrapper", "partial", "object"])
def test_a_collective_replaced_before_import_still_runs_and_is_watched_where_it_can_be(tmp_path, kind):
    completed = run_replaced(tmp_path, kind)
    assert completed.returncode == 0, completed.stdout
    plain, debug = [json.loads(line.split(" ", 1)[1]) for line in completed.stdout.splitlines()
                    if line.startswith("RESULTS ")]
    summed = 6.0 if kind == "wrapper" else 3.0  # the user's wrapper runs, debug mode or not
    for rank in ("0", "1"):
        expected = {"c10d.all_reduce": summed, "ops.reduce": 2.0, "check_trigger": False}
        assert plain[rank] == expected
        if kind != "object":  # the function behind the wrapper or partial is watched: debug mode catches it
            expected["disagreeing dist.all_reduce"] = "DistributedOperationException"
        assert debug[rank] == expected
    hidden = "distributed_c10d.all_reduce (used by ops): replaced by an object of type Opaque that hides torch's"
    assert completed.stdout.count(hidden) == (2 if kind == "object" else 0)  # said once per launch


def fails_in_a_collective():
    dist.all_reduce(torch.ones(2), op=R.BAND)  # torch refuses BAND on floats


def test_a_traceback_through_a_watched_collective_shows_a_line_that_says_what_it_is():
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(fails_in_a_collective, num_processes=2, device="cpu", display="text")
    message = str(caught.value)
    frame = re.search(r'File "[^"]*intercept\.py", line \d+, in all_reduce\n(.*)\n', message)
    assert frame, message
    assert frame.group(1).strip() == \
        "return _notebook_launcher_hook_(*args, **kwargs)  # notebook_launcher: this collective, watched"
    assert "RuntimeError: Cannot use ReduceOp.BAND with non-integral dtype" in message
