"""DDP's own collectives (the reducer's gradient all_reduce, run in C++) are in the rank's progress record: a
hang inside DDP's backward names DDP, the step and the user's line; DDP's numbers and a user's comm hook are
unchanged by it."""

import os
import time

import psutil
import pytest
import torch

from notebook_launcher import LaunchTimeoutError, last_run, notebook_launcher


@pytest.fixture(autouse=True)
def no_debug_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    monkeypatch.delenv("NOTEBOOK_LAUNCHER_DDP_WATCH", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.BatchNorm1d(16),
                               torch.nn.Linear(16, 4))


def _train(steps=4, hook=None):
    """A few DDP steps on rank-dependent data; the final weights, and whether the record saw DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from notebook_launcher.rank import ddp_watch

    model = DistributedDataParallel(_model(), bucket_cap_mb=0.0001)  # several buckets
    calls = []
    if hook is not None:
        def user_hook(state, bucket):
            calls.append(bucket.index())
            return hook(state, bucket)

        model.register_comm_hook(None, user_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 8, generator=generator)).square().mean().backward()
        optimizer.step()
    return {"weights": [p.detach().clone() for p in model.parameters()], "hook_calls": len(calls),
            "watched": ddp_watch.record() is not None and ddp_watch.enabled()}


@pytest.mark.processes
def test_ddp_numbers_are_those_of_plain_ddp(monkeypatch):
    watched = notebook_launcher(_train, num_processes=2, device="cpu", timeout=120)
    monkeypatch.setenv("NOTEBOOK_LAUNCHER_DDP_WATCH", "0")
    plain = notebook_launcher(_train, num_processes=2, device="cpu", timeout=120)
    assert watched["watched"] and not plain["watched"]
    assert all(torch.equal(a, b) for a, b in zip(watched["weights"], plain["weights"]))
    assert not all(torch.equal(a, b) for a, b in zip(watched["weights"], _model().parameters()))  # it trained


def _zero_gradients(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return allreduce_hook(None, bucket).then(lambda future: future.value() * 0)


def _train_with_a_zeroing_hook():
    return _train(steps=3, hook=_zero_gradients)


@pytest.mark.processes
def test_a_users_comm_hook_runs_and_its_result_is_used():
    result = notebook_launcher(_train_with_a_zeroing_hook, num_processes=2, device="cpu", timeout=120)
    assert result["hook_calls"] >= 3 * 2  # every bucket of every step went through it
    initial = list(_model().parameters())
    assert all(torch.equal(a, b) for a, b in zip(result["weights"], initial))  # gradients of zero: unchanged


def _leaves_the_loop_early():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    for step in range(5):
        if dist.get_rank() == 1 and step == 3:
            return "left"  # rank 1 leaves early: rank 0 waits in DDP's all_reduce of its 4th backward
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()  # the line the record names
    return "done"


@pytest.mark.processes
def test_a_rank_waiting_inside_ddps_backward_is_named_with_its_step_and_line():
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(_leaves_the_loop_early, num_processes=2, device="cpu", timeout=60)
    message = str(caught.value)
    line = _leaves_the_loop_early.__code__.co_firstlineno + 9
    assert message.startswith("The ranks stopped making progress: rank 1 had finished its function (last "
                              "collective: DDP gradient all_reduce #5 at")  # #1, #2: DDP(...)'s shape check, broadcast
    assert ("rank 0: waiting" in message
            and f"in DDP gradient all_reduce #6 at {__file__}:{line} in _leaves_the_loop_early" in message)
    assert last_run().status == "hung"
    assert psutil.Process().children(recursive=True) == []


def _blocked_in_backward_while_the_other_is_busy():
    import time

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    if dist.get_rank() == 1:
        time.sleep(60)  # busy in its own code: rank 0's backward waits for it
    model(torch.ones(2, 4)).sum().backward()


@pytest.mark.processes
def test_at_the_timeout_a_rank_in_ddps_backward_is_shown_waiting_there():
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(_blocked_in_backward_while_the_other_is_busy, num_processes=2, device="cpu",
                          timeout=20)  # well past DDP's construction (about 2 s, 10 s on a loaded machine)
    message = str(caught.value)
    assert "rank 1 is not in any collective: busy or stuck in its own code" in message
    assert "rank 0: waiting" in message and "in DDP gradient all_reduce #3 at" in message
    assert os.path.basename(__file__) in message


def _records_while_training():
    """The rank's own record (what the kernel reads), inside DDP's backward (from a user's comm hook, which
    runs inside ours), after a forward and after each backward."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from notebook_launcher.rank import ddp_watch

    record = ddp_watch.record()
    seen = {"constructed": None, "in_backward": [], "after_forward": [], "after_backward": []}

    def reading_hook(state, bucket):
        seen["in_backward"].append(record.read())
        return allreduce_hook(None, bucket)

    model = DistributedDataParallel(_model())
    seen["constructed"] = record.read()
    model.register_comm_hook(None, reading_hook)
    for _ in range(3):
        output = model(torch.randn(8, 8))
        seen["after_forward"].append(record.read())
        output.sum().backward()
        seen["after_backward"].append(record.read())
    return seen


@pytest.mark.processes
def test_the_record_holds_ddps_collective_step_line_and_progress():
    seen = notebook_launcher(_records_while_training, num_processes=2, device="cpu", timeout=120)
    lines = {name: _records_while_training.__code__.co_firstlineno + offset
             for name, offset in (("construct", 15), ("forward", 19), ("backward", 21))}
    where = f"{__file__}:{{}} in _records_while_training"
    constructed = seen["constructed"]
    assert constructed["operation"] == "DDP parameter broadcast" and not constructed["inside"]
    assert constructed["call_site"] == where.format(lines["construct"])
    for step, (forward, inside, after) in enumerate(zip(seen["after_forward"], seen["in_backward"],
                                                        seen["after_backward"]), start=1):
        assert forward["operation"] == "DDP buffer broadcast" and forward["step"] == step  # BatchNorm's buffers
        assert forward["call_site"] == where.format(lines["forward"])
        assert inside["inside"] and inside["operation"] == "DDP gradient all_reduce" and inside["step"] == step
        assert inside["call_site"] == where.format(lines["backward"])
        assert not after["inside"] and after["step"] == step and after["sequence"] == inside["sequence"]
        assert inside["sequence"] > forward["sequence"]  # each backward is a new collective: progress when it ends


def test_the_kernel_reads_ddps_step_from_the_record_and_times_it_itself(tmp_path):
    """What the rank writes at every step is two integers, no clock: the kernel's HangWatch says since when it
    saw the rank inside; a collective called inside DDP's backward (a user's hook) is the innermost while it
    runs, and DDP's backward is where the rank is again once it has returned."""
    from notebook_launcher.schema.progress_record import ProgressRecord
    from notebook_launcher.supervision.hangs import HangWatch

    watch = HangWatch(str(tmp_path))
    rank_side = ProgressRecord(watch.path_for(0))
    rank_side.enter("broadcast", "train.py:3 in main")
    rank_side.leave()
    rank_side.ddp_site("train.py:9 in main")
    before = time.monotonic()
    entered = rank_side.enter_ddp(step=4)
    seen = watch.read()[0]
    assert seen["inside"] and seen["operation"] == "DDP gradient all_reduce" and seen["step"] == 4
    assert seen["sequence"] == 2 and seen["call_site"] == "train.py:9 in main"
    assert before <= seen["since"] <= time.monotonic()
    time.sleep(0.05)
    assert watch.read()[0]["since"] == seen["since"]  # the same entry: the same since
    rank_side.enter("all_reduce", "train.py:20 in hook")
    assert watch.read()[0]["operation"] == "all_reduce" and watch.read()[0]["sequence"] == 3
    rank_side.leave()
    again = watch.read()[0]
    assert again["inside"] and again["operation"] == "DDP gradient all_reduce" and again["sequence"] == 2
    rank_side.leave_ddp(entered)
    after = watch.read()[0]
    assert not after["inside"] and after["operation"] == "all_reduce"  # the last one it left
    entered = rank_side.enter_ddp(step=5)
    rank_side.leave_ddp(entered)
    last = watch.read()[0]
    assert not last["inside"] and last["operation"] == "DDP gradient all_reduce" and last["sequence"] == 4
    rank_side.close()
    watch.close()


def _uneven_inputs_under_join():
    """Rank 1 has fewer batches; under model.join() it shadows rank 0's last gradient all_reduces."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from notebook_launcher.rank import ddp_watch

    operations = []

    def noting_hook(state, bucket):
        operations.append(ddp_watch.record().read()["operation"])
        return allreduce_hook(None, bucket)

    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    model.register_comm_hook(None, noting_hook)
    with model.join():
        for _ in range(5 if dist.get_rank() == 0 else 3):
            model(torch.ones(2, 4)).sum().backward()
    return {"operations": operations, "weight": model.module.weight.detach().clone()}


@pytest.mark.processes
def test_a_rank_that_joined_early_is_in_ddp_join_while_it_shadows_the_others():
    notebook_launcher(_uneven_inputs_under_join, num_processes=2, device="cpu", timeout=120)
    results = last_run().results
    assert results[0]["operations"] == ["DDP gradient all_reduce"] * 5
    assert results[1]["operations"] == ["DDP gradient all_reduce"] * 3 + ["DDP join"] * 2
    assert torch.equal(results[0]["weight"], results[1]["weight"])


def _no_sync_then_sync():
    from torch.nn.parallel import DistributedDataParallel

    from notebook_launcher.rank import ddp_watch

    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    steps = []
    for _ in range(2):
        with model.no_sync():  # gradient accumulation: no collective, not a DDP step
            model(torch.ones(2, 4)).sum().backward()
        steps.append(ddp_watch.record().read()["step"])
        model(torch.ones(2, 4)).sum().backward()
        steps.append(ddp_watch.record().read()["step"])
    return steps


@pytest.mark.processes
def test_steps_count_the_backward_passes_that_synchronize():
    assert notebook_launcher(_no_sync_then_sync, num_processes=2, device="cpu", timeout=120, debug=True) == \
        [0, 1, 1, 2]  # (debug mode on: DDP runs as usual there too)


def _leaves_the_loop_early_then_waits_at_a_barrier():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    for step in range(5):
        if dist.get_rank() == 1 and step == 3:
            break  # rank 1 leaves early and waits at the barrier; rank 0 waits in DDP's 4th all_reduce
        model(torch.ones(2, 4)).sum().backward()
    dist.barrier()


@pytest.mark.processes
def test_at_the_timeout_ranks_in_ddps_backward_and_at_a_barrier_are_told_apart():
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(_leaves_the_loop_early_then_waits_at_a_barrier, num_processes=2, device="cpu",
                          timeout=20)  # well past DDP's construction and 3 steps, on a loaded machine too
    message = str(caught.value)
    function = _leaves_the_loop_early_then_waits_at_a_barrier
    backward = f"{__file__}:{function.__code__.co_firstlineno + 8} in {function.__name__}"
    assert "they wait in different collectives" in message
    assert f"in DDP gradient all_reduce #6 at {backward}" in message  # #1, #2: DDP(...)'s shape check, broadcast
    assert "in barrier #6 at" in message
    assert psutil.Process().children(recursive=True) == []


class _NestedOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x):
        return {"out": (self.layer(x),)}  # two levels deep: no hook can find the tensor


def _steps_of_odd_training_loops():
    """A model whose output is nested, and a loop that takes a gradient penalty with torch.autograd.grad before
    its backward (as physics-informed nets and WGAN-GP do): each backward() is one step, the grad() is not."""
    from torch.nn.parallel import DistributedDataParallel

    from notebook_launcher.rank import ddp_watch

    nested = DistributedDataParallel(_NestedOutput())
    for _ in range(3):
        nested(torch.ones(2, 4))["out"][0].sum().backward()
    nested_record = ddp_watch.record().read()
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    for _ in range(4):
        x = torch.ones(2, 4, requires_grad=True)
        out = model(x)
        (penalty,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        (out.sum() + penalty.square().sum()).backward()
    return nested_record, ddp_watch.record().read()


@pytest.mark.processes
def test_a_nested_output_and_a_gradient_penalty_leave_the_steps_right():
    nested, penalized = notebook_launcher(_steps_of_odd_training_loops, num_processes=2, device="cpu", timeout=120)
    assert nested["operation"] == "DDP gradient all_reduce" and nested["step"] == 3 and not nested["inside"]
    assert penalized["operation"] == "DDP gradient all_reduce" and penalized["step"] == 4
    function = _steps_of_odd_training_loops
    assert penalized["call_site"] == f"{__file__}:{function.__code__.co_firstlineno + 16} in {function.__name__}"


def _fsdp_step():
    from torch.distributed.fsdp import FullyShardedDataParallel

    from notebook_launcher.rank import ddp_watch

    model = FullyShardedDataParallel(torch.nn.Linear(4, 4), device_id=torch.device("cpu"))
    model(torch.ones(2, 4)).sum().backward()
    return ddp_watch.record().read()


@pytest.mark.processes
def test_fsdps_collectives_are_named_as_fsdps():
    record = notebook_launcher(_fsdp_step, num_processes=2, device="cpu", timeout=120)
    assert record["operation"].startswith("FSDP ") and not record["inside"]  # e.g. "FSDP reduce_scatter_single"
    assert record["call_site"] == f"{__file__}:{_fsdp_step.__code__.co_firstlineno + 6} in _fsdp_step"
