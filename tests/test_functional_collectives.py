"""FSDP2, DTensor and compiled code in a real Jupyter kernel, as their docs write them: their collectives (the
``_c10d_functional`` ops and their waits) are checked by debug mode and seen by the hang watch like
``dist.all_reduce``'s, a compiled mismatch raises instead of returning a value, and a state dict of DTensors comes
back whole or is refused with the fix; never one rank's shard that looks whole.

2 CPU ranks (gloo), forked from the kernel; a kernel per test, each test a cell or two in it.
"""

from __future__ import annotations

import json
import re

import pytest
from helpers.kernel import _assert_ok, _stream, run_cell, running_kernel

pytestmark = [pytest.mark.slow, pytest.mark.kernel]  # every test here starts a kernel and a launch

CELL_S = 150  # a cell's bound: a launch with torch.compile takes ~15 s here, more on a loaded machine

SETUP = '''\
import json, time
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from notebook_launcher import last_run, notebook_launcher

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

def batch(step):
    generator = torch.Generator().manual_seed(step)
    return torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)

def train_fsdp2(steps=3, slow_rank_s=0.0, return_as="full"):
    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rank = dist.get_rank()
    for step in range(steps):
        inputs, targets = batch(step)
        half = slice(4 * rank, 4 * rank + 4)  # each rank its half of the batch
        torch.nn.functional.mse_loss(model(inputs[half]), targets[half]).backward()
        optimizer.step()
        optimizer.zero_grad()
    if return_as == "state_dict":
        return model.state_dict()
    if return_as == "state_dict on rank 0":
        return model.state_dict() if rank == 0 else None
    if rank == 1:
        time.sleep(slow_rank_s)
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))

def reference(steps=3):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        inputs, targets = batch(step)
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()

def same(state, expected):
    return sorted(state) == sorted(expected) and all(
        type(state[key]) is torch.Tensor and state[key].shape == expected[key].shape
        and torch.allclose(state[key], expected[key], atol=1e-6) for key in expected)

def notices():
    return [event.data for event in last_run().events if event.kind == "hang_notice"]
'''


@pytest.fixture
def kernel(tmp_path, runs_dir):
    """A kernel of its own for each test (a hang that was not stopped must not stall the next test)."""
    with running_kernel(tmp_path) as (_, client, _):
        _assert_ok(*run_cell(client, SETUP, timeout=CELL_S))
        yield client


def printed(client, code: str) -> dict:
    """Runs ``code`` in the kernel; what its last line printed, as JSON."""
    reply, outputs = run_cell(client, code, timeout=CELL_S)
    _assert_ok(reply, outputs)
    return json.loads(_stream(outputs).strip().splitlines()[-1])


def test_fsdp2_trained_in_a_kernel_returns_the_full_state_dict_of_a_one_process_reference(kernel):
    seen = printed(kernel, '''\
expected = reference()
print(json.dumps({str(debug): same(notebook_launcher(train_fsdp2, num_processes=2, device="cpu", debug=debug,
                                                     display="text"), expected) for debug in (False, True)}))
''')
    assert seen == {"False": True, "True": True}


def test_an_fsdp2_state_dict_returned_as_it_is_comes_back_whole_or_is_refused_with_the_fix(kernel):
    seen = printed(kernel, '''\
whole = notebook_launcher(train_fsdp2, args=(3, 0.0, "state_dict"), num_processes=2, device="cpu",
                          display="text")
try:
    notebook_launcher(train_fsdp2, args=(3, 0.0, "state_dict on rank 0"), num_processes=2, device="cpu",
                      display="text")
    refused = "returned a value"
except Exception as error:
    refused = f"{type(error).__name__}: {error}"
print(json.dumps({"whole": same(whole, reference()), "refused": refused}))
''')
    assert seen["whole"] is True  # every rank returned its DTensors: gathered into full tensors
    refused = seen["refused"]
    assert refused.startswith("ResultUnavailableError: rank 0 finished"), refused
    assert "a DTensor of shape [32, 16], one rank's shard" in refused, refused
    assert "rank 1 did not return the same sharded tensors" in refused, refused
    assert "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))" in refused, refused


def test_a_functional_all_reduce_mismatch_in_debug_mode_raises_with_both_shapes(kernel):
    seen = printed(kernel, '''\
def mismatched():
    summed = funcol.all_reduce(torch.ones(3 + dist.get_rank()), "sum", dist.group.WORLD)
    return summed + 0

try:
    notebook_launcher(mismatched, num_processes=2, device="cpu", debug=True, display="text")
    raised = "returned a value"
except Exception as error:
    raised = f"{type(error).__name__}: {error}"
print(json.dumps(raised))
''')
    assert re.match(r"RankFailedError: Rank \d failed first: DistributedOperationException: Cannot apply desired "
                    r"operation due to shape mismatches", seen), seen  # as dist.all_reduce's
    assert "Operation: `torch.ops._c10d_functional.all_reduce`" in seen, seen
    assert "- Process 0: [3]" in seen and "- Process 1: [4]" in seen, seen
    assert re.search(r"- Process 1: cell In\[\d+\], line 2 in mismatched", seen), seen
    assert "SIGABRT" not in seen and "EnforceNotMet" not in seen, seen


def test_a_functional_all_reduce_rank_1_skips_gets_a_notice_and_the_hang_stop(kernel):
    seen = printed(kernel, '''\
def skips_a_functional_all_reduce():
    if dist.get_rank() == 0:
        return (funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD) + 0).tolist()
    time.sleep(6)  # rank 1 is busy in its own code, then returns without joining it
    return None

try:
    notebook_launcher(skips_a_functional_all_reduce, num_processes=2, device="cpu", hang_warning=2, display="text")
    stopped = "returned a value"
except Exception as error:
    stopped = f"{type(error).__name__}: {error}"
print(json.dumps({"stopped": stopped, "status": last_run().status, "notices": notices()}))
''')
    assert seen["status"] == "hung"
    stopped = seen["stopped"]
    assert stopped.startswith("LaunchTimeoutError: The ranks stopped making progress: rank 1 had finished its "
                              "function"), stopped
    assert re.search(r"rank 0: waiting [\d.]+ s in functional all_reduce #1 \(async, in its wait\(\)\) at "
                     r"cell In\[\d+\], line 3 in skips_a_functional_all_reduce", stopped), stopped
    assert seen["notices"] and seen["notices"][0]["ranks"]["0"]["state"] == "waiting", seen["notices"]


def test_a_slow_fsdp2_rank_in_get_model_state_dict_gets_a_notice_naming_where_rank_0_waits(kernel):
    seen = printed(kernel, '''\
state = notebook_launcher(train_fsdp2, args=(3, 15.0), num_processes=2, device="cpu", hang_warning=5,
                          display="text")
print(json.dumps({"same": same(state, reference()), "notices": notices(), "status": last_run().status}))
''')
    assert seen["status"] == "finished" and seen["same"] is True
    opened = [notice for notice in seen["notices"] if notice["state"] == "open"]
    assert opened, seen["notices"]
    waiting = opened[0]["ranks"]["0"]
    assert waiting["state"] == "waiting", opened
    assert re.fullmatch(r"waiting \d+ s in functional all_gather #\d+ \(async, in its wait\(\)\) at cell In\[\d+\], "
                        r"line \d+ in train_fsdp2", waiting["text"]), waiting
    assert opened[0]["ranks"]["1"]["state"] == "busy", opened


def test_a_compiled_ddp_model_gets_no_notice_and_the_weights_of_eager(kernel):
    seen = printed(kernel, '''\
from torch.nn.parallel import DistributedDataParallel

def compiled_and_eager():
    weights = {}
    for name in ("eager", "compiled"):
        model = DistributedDataParallel(make_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        forward = torch.compile(model) if name == "compiled" else model
        for step in range(3):
            inputs, targets = batch(step)
            half = slice(4 * dist.get_rank(), 4 * dist.get_rank() + 4)
            torch.nn.functional.mse_loss(forward(inputs[half]), targets[half]).backward()
            optimizer.step()
            optimizer.zero_grad()
        weights[name] = model.module.state_dict()
    return weights

weights = notebook_launcher(compiled_and_eager, num_processes=2, device="cpu", display="text")
print(json.dumps({"same": same(weights["compiled"], weights["eager"]), "notices": notices(),
                  "status": last_run().status}))
''')
    assert seen == {"same": True, "notices": [], "status": "finished"}


def test_a_compiled_all_reduce_mismatch_in_debug_mode_raises_and_returns_no_value(kernel):
    seen = printed(kernel, '''\
def compiled_mismatch():
    def doubled_sum(values):
        dist.all_reduce(values)  # dynamo makes it a functional all_reduce
        return values * 2
    return torch.compile(doubled_sum)(torch.ones(3 + dist.get_rank())).tolist()

try:
    value = notebook_launcher(compiled_mismatch, num_processes=2, device="cpu", debug=True, display="text")
    raised = f"returned {value}"
except Exception as error:
    raised = f"{type(error).__name__}: {error}"
print(json.dumps({"raised": raised, "results": {str(rank): str(value) for rank, value in last_run().results.items()}}))
''')
    raised = seen["raised"]
    assert re.match(r"RankFailedError: Rank \d failed first: DistributedOperationException: Cannot apply desired "
                    r"operation due to shape mismatches", raised), raised
    assert "- Process 0: [3]" in raised and "- Process 1: [4]" in raised, raised
    assert re.search(r"- Process 0: cell In\[\d+\], line \d+ in doubled_sum", raised), raised
    assert seen["results"] == {}, seen["results"]  # no rank returned a value
