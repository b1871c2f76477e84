"""Every collective seen, however the code reached it: names imported from torch.distributed before the launch,
``distributed_c10d``'s functions called directly, a ``functools.partial`` made beforehand, object and coalesced
variants; and the collectives torch runs on its own (DDP's reducer) named from the rank's stack.

Real 2-rank CPU launches (gloo), real DDP, Accelerate's own data-loop script; the interception itself
(``rank/intercept.py``) on real torch functions in this process, restored afterwards.
"""

from __future__ import annotations

import functools
import inspect
import pickle
import re

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed import all_gather, all_reduce, barrier  # bound before any launch, as a notebook cell does

from notebook_launcher import DistributedOperationException, LaunchTimeoutError, last_run, notebook_launcher
from notebook_launcher.rank import intercept
from notebook_launcher.supervision.stacks import torch_place

PARTIAL_REDUCE = functools.partial(c10d.all_reduce, op=dist.ReduceOp.SUM)  # made before the launch


def notices(run):
    return [event.data for event in run.events if event.kind == "hang_notice"]


# -- debug mode, however the collective was reached ----------------------------------------------------------------
def mismatched(kind):
    rank = dist.get_rank()
    tensor = torch.zeros(2 + rank)  # rank 0: [2], rank 1: [3]
    try:
        if kind == "imported all_gather":
            all_gather([torch.zeros(2 + rank) for _ in range(2)], tensor)
        elif kind == "distributed_c10d.all_reduce":
            c10d.all_reduce(tensor)
        elif kind == "partial":
            PARTIAL_REDUCE(tensor)
        elif kind == "_all_gather_base":
            c10d._all_gather_base(torch.zeros(2 * (2 + rank)), tensor)
        elif kind == "all_reduce_coalesced":
            c10d.all_reduce_coalesced([torch.zeros(1)] * (1 + rank))
    except DistributedOperationException as error:
        return str(error)
    return "no DistributedOperationException"


@pytest.mark.parametrize("kind", ["imported all_gather", "distributed_c10d.all_reduce", "partial", "_all_gather_base"])
@pytest.mark.processes
def test_debug_mode_checks_a_collective_however_it_was_reached(kind):
    notebook_launcher(mismatched, args=(kind,), num_processes=2, device="cpu", debug=True, display="text")
    results = last_run().results
    operation = {"imported all_gather": "all_gather", "partial": "all_reduce"}.get(kind, kind.split(".")[-1])
    for rank in (0, 1):  # raised on every rank, with both ranks' shapes
        message = results[rank]
        assert message.startswith("Cannot apply desired operation due to shape mismatches."), message
        assert f"Operation: `torch.distributed.{operation}`" in message, message
        assert "- Process 0: [2]" in message and "- Process 1: [3]" in message, message


@pytest.mark.processes
def test_debug_mode_checks_the_coalesced_variant_on_the_list_it_reduces():
    notebook_launcher(mismatched, args=("all_reduce_coalesced",), num_processes=2, device="cpu", debug=True,
                      display="text")
    for message in last_run().results.values():
        assert "Operation: `torch.distributed.all_reduce_coalesced`" in message, message


def agreeing_calls():
    """Every kind of call, agreeing: the values come out as torch computes them, interception or not."""
    rank = dist.get_rank()
    summed = torch.full((3,), float(rank + 1))
    all_reduce(summed)
    PARTIAL_REDUCE(summed)
    gathered = [None, None]
    c10d.all_gather_object(gathered, {"rank": rank})
    objects = [None, None]
    dist.gather_object(rank * 10, objects if rank == 0 else None, dst=0)
    coalesced = [torch.ones(2) * (rank + 1), torch.ones(1)]
    c10d.all_reduce_coalesced(coalesced)
    barrier()
    return summed.tolist(), gathered, objects if rank == 0 else None, [t.tolist() for t in coalesced]


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.processes
def test_intercepted_collectives_compute_what_torch_computes(debug):
    result = notebook_launcher(agreeing_calls, num_processes=2, device="cpu", debug=debug, display="text")
    assert result == ([6.0, 6.0, 6.0], [{"rank": 0}, {"rank": 1}], [0, 10], [[3.0, 3.0], [2.0]])


# -- the hang watch, however the collective was reached -------------------------------------------------------------
def different_imported_collectives():
    if dist.get_rank() == 0:
        all_reduce(torch.ones(1))
    else:
        barrier()


@pytest.mark.processes
def test_a_hang_in_imported_collectives_is_noticed_naming_both_and_the_timeout_says_where_each_waits():
    hang_warning = 4
    with pytest.raises(LaunchTimeoutError) as raised:
        notebook_launcher(different_imported_collectives, num_processes=2, device="cpu", hang_warning=hang_warning,
                          timeout=25, display="text")
    run = last_run()
    opened = notices(run)[0]
    assert opened["state"] == "open" and opened["quiet_s"] <= hang_warning + 5
    assert re.fullmatch(r"waiting \d+ s in all_reduce #1 at .*test_collectives_reached\.py:\d+ in "
                        r"different_imported_collectives", opened["ranks"]["0"]["text"])
    assert re.fullmatch(r"waiting \d+ s in barrier #1 at .*", opened["ranks"]["1"]["text"])
    assert "ranks wait in different collectives: rank 0 in all_reduce #1, rank 1 in barrier #1." in opened["text"]
    message = str(raised.value)
    assert "they wait in different collectives (rank 0 in all_reduce #1, rank 1 in barrier #1)" in message
    assert "not in any collective" not in message and "own code" not in message


@pytest.mark.processes
def test_accelerates_uneven_inputs_join_names_ddps_forward_and_the_barrier():
    """Accelerate's own test_distributed_data_loop.py, its join-uneven-inputs case (which hangs on CPU, with
    torchrun as well): rank 0 is in DDP's forward (its reducer's bucket rebuild, a C++ collective), rank 1 in
    the barrier of ``wait_for_everyone()``."""
    def join_uneven_inputs():
        from accelerate.test_utils.scripts.test_distributed_data_loop import test_can_join_uneven_inputs

        test_can_join_uneven_inputs()

    with pytest.raises(LaunchTimeoutError) as raised:
        notebook_launcher(join_uneven_inputs, num_processes=2, device="cpu", hang_warning=3, timeout=25,
                          display="text")
    run = last_run()
    opened = notices(run)[0]
    assert opened["ranks"]["0"]["state"] == "in_ddp"
    assert re.fullmatch(r"in DDP's forward \(a collective of DDP's reducer\) at .*test_collectives_reached\.py:\d+ "
                        r"in join_uneven_inputs", opened["ranks"]["0"]["text"])
    assert re.fullmatch(r"waiting \d+ s in barrier #\d+ at .*", opened["ranks"]["1"]["text"])
    assert re.search(r"ranks wait in different collectives: rank 0 in DDP's forward, rank 1 in barrier #\d+\.",
                     opened["text"])
    message = str(raised.value)
    assert "own code" not in opened["text"] and "own code" not in message
    assert re.search(r"they wait in different collectives \(rank 0 in DDP's forward, rank 1 in barrier #\d+\)",
                     message)
    assert "rank 0: in DDP's forward (a collective of DDP's reducer) at " in message


# -- torch's own places, from a stack dump ----------------------------------------------------------------------------
def _dump(*frames):
    lines = ["Current thread 0x00007f0000000000 (most recent call first):"]
    return lines + [f'  File "{file}", line {line} in {function}' for file, line, function in frames]


TORCH = "/venv/lib/python3.11/site-packages/torch/"


def test_torch_place_names_torchs_code_and_never_the_users():
    user = ("/home/me/train.py", 31, "train")
    module_call = (f"{TORCH}nn/modules/module.py", 1700, "_call_impl")
    ddp_forward = (f"{TORCH}nn/parallel/distributed.py", 1650, "forward")
    ddp = _dump((f"{TORCH}nn/parallel/distributed.py", 1500, "_pre_forward"), ddp_forward, module_call, user)
    assert torch_place(ddp) == "DDP's forward (a collective of DDP's reducer)"
    buffers = _dump((f"{TORCH}nn/parallel/distributed.py", 1900, "_sync_buffers"),
                    (f"{TORCH}nn/parallel/distributed.py", 1500, "_pre_forward"), ddp_forward, module_call, user)
    assert torch_place(buffers) == "DDP's buffer broadcast"
    fsdp = _dump((f"{TORCH}distributed/utils.py", 10, "_alloc_storage"),
                 (f"{TORCH}distributed/fsdp/_runtime_utils.py", 400, "_pre_forward"), user)
    assert torch_place(fsdp) == "FSDP's _pre_forward"
    new_group = _dump((f"{TORCH}distributed/distributed_c10d.py", 10, "_new_process_group_helper"),
                      (f"{TORCH}distributed/distributed_c10d.py", 20, "new_group"),
                      (f"{TORCH}distributed/c10d_logger.py", 83, "wrapper"), user)
    assert torch_place(new_group) == "torch.distributed's new_group"
    # computing, whatever is around it: never a collective
    computing = {
        "the user's model inside DDP's forward": [("/home/me/model.py", 9, "forward"), module_call, ddp_forward],
        "torch's Linear inside DDP's forward": [(f"{TORCH}nn/modules/linear.py", 125, "forward"), module_call,
                                                 ddp_forward],
        "a library's model inside DDP's forward": [
            ("/venv/lib/python3.11/site-packages/transformers/models/gpt2/modeling_gpt2.py", 700, "forward"),
            module_call, ddp_forward],
        "torch compute inside FSDP's forward": [(f"{TORCH}nn/modules/activation.py", 1200, "forward"), module_call,
                                                 (f"{TORCH}distributed/fsdp/fully_sharded_data_parallel.py", 850,
                                                  "forward")],
        "autograd under Accelerate's backward": [(f"{TORCH}autograd/graph.py", 800, "_engine_run_backward"),
                                                  ("/venv/lib/python3.11/site-packages/accelerate/accelerator.py",
                                                   2700, "backward")],
        "a data loader under Accelerate's": [(f"{TORCH}utils/data/dataloader.py", 700, "__next__"),
                                             ("/venv/lib/python3.11/site-packages/accelerate/data_loader.py", 560,
                                              "__iter__")],
        "torch compute, nothing distributed": [(f"{TORCH}nn/modules/linear.py", 125, "forward")],
    }
    for what, frames in computing.items():
        assert torch_place(_dump(*frames, user)) == "", what
    assert torch_place([]) == ""


def test_at_a_timeout_a_place_from_the_stack_alone_is_no_verdict():
    """Two DDP ranks caught at timeout= in DDP's forward (a stack says where, not for how long): a long run,
    not a hang; beside a rank that has waited long in a recorded collective, it is one."""
    from notebook_launcher.schema.events import STREAM, Event
    from notebook_launcher.supervision.failure import FailureTracker, hang_message

    dump = _dump((f"{TORCH}nn/parallel/distributed.py", 1500, "_pre_forward"),
                 (f"{TORCH}nn/parallel/distributed.py", 1650, "forward"), ("/home/me/train.py", 31, "train"))
    tracker = FailureTracker()
    for rank in (0, 1):
        for seq, line in enumerate(dump, start=10):
            tracker.observe(Event(rank, seq, 1.0, STREAM, {"stream": "stderr", "text": line}))
    running = {"state": "running", "inside": False, "operation": "all_reduce", "sequence": 3, "call_site": "x:1",
               "now": 100.0, "since": 0.0}
    message = hang_message({0: dict(running), 1: dict(running)}, tracker, {0: 9, 1: 9}, 100, "/runs/x",
                           timed_out=True)
    assert "stopped making progress" not in message, message
    assert "rank 0: in DDP's forward (a collective of DDP's reducer) at /home/me/train.py:31 in train" in message
    waiting = {**running, "inside": True, "operation": "barrier", "sequence": 4, "since": 90.0}
    message = hang_message({0: dict(running), 1: waiting}, tracker, {0: 9, 1: 9}, 100, "/runs/x", timed_out=True)
    assert "they wait in different collectives (rank 0 in DDP's forward, rank 1 in barrier #4)" in message


def busy_in_python_while_the_other_waits():
    import time

    if dist.get_rank() == 1:
        end = time.monotonic() + 60
        while time.monotonic() < end:  # busy in its own Python code, for longer than the run's timeout
            pass
    barrier()


@pytest.mark.processes
def test_a_rank_busy_in_a_python_loop_is_busy_in_its_own_code_not_in_torch():
    with pytest.raises(LaunchTimeoutError) as raised:
        notebook_launcher(busy_in_python_while_the_other_waits, num_processes=2, device="cpu", hang_warning=3,
                          timeout=15, display="text")
    opened = notices(last_run())[0]
    assert opened["ranks"]["1"]["state"] == "busy"
    assert opened["ranks"]["1"]["text"].startswith("busy in its own code at ")
    assert "rank 1 diverged" in opened["text"]
    assert "busy or stuck in its own code" in str(raised.value) and "DDP" not in str(raised.value)


# -- the interception itself ------------------------------------------------------------------------------------------
def test_intercept_keeps_identity_signature_and_pickling_and_restores():
    calls = []

    def make_hook(original):
        def hook(*args, **kwargs):
            calls.append(args)
            return original(*args, **kwargs)
        return hook

    before = inspect.signature(c10d.isend), inspect.signature(c10d.all_reduce)
    imported, partial = all_reduce, functools.partial(dist.isend)
    try:
        intercept.intercept(c10d.all_reduce, make_hook)
        intercept.intercept(c10d.isend, make_hook)  # (not decorated: no __wrapped__, a signature is kept)
        with pytest.raises(RuntimeError, match="intercepted already"):
            intercept.intercept(c10d.all_reduce, make_hook)
        assert (inspect.signature(c10d.isend), inspect.signature(c10d.all_reduce)) == before
        assert dist.all_reduce is imported and pickle.loads(pickle.dumps(imported)) is imported
        for call in (imported, partial):  # no process group here: torch's own error, after the hook saw it
            with pytest.raises((ValueError, RuntimeError, TypeError)):
                call(torch.ones(1))
        assert len(calls) == 2
    finally:
        intercept.restore(c10d.all_reduce)
        intercept.restore(c10d.isend)
    assert not intercept.is_intercepted(c10d.all_reduce) and not intercept.is_intercepted(c10d.isend)
    assert (inspect.signature(c10d.isend), inspect.signature(c10d.all_reduce)) == before
    with pytest.raises((ValueError, RuntimeError, TypeError)):
        imported(torch.ones(1))
    assert len(calls) == 2
