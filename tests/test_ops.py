"""Collectives, debug mode, hang diagnosis and early-stop triggers, with real ranks on gloo."""

import os
import textwrap
import time

import psutil
import pytest
import torch
from helpers.processes import run_torchrun

from notebook_launcher import (
    LaunchTimeoutError,
    RankFailedError,
    check_trigger,
    last_run,
    notebook_launcher,
    ops,
    set_trigger,
)


@pytest.fixture(autouse=True)
def no_debug_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    monkeypatch.delenv("ACCELERATE_CONFIG_FILE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no default Accelerate config file from this machine


def every_op():
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = torch.tensor([float(rank), rank + 0.5])
    return {
        "gather": ops.gather(mine).tolist(),
        "gather_nested": {k: v.tolist() for k, v in ops.gather({"a": mine[:1]}).items()},
        "gather_object": ops.gather_object([f"r{rank}"]),
        "broadcast": ops.broadcast(mine.clone(), from_process=1).tolist(),
        "broadcast_object_list": ops.broadcast_object_list([rank, f"from {rank}"], from_process=0),
        "sum": ops.reduce(mine).tolist(),
        "mean": ops.reduce(mine, "mean").tolist(),
        "max": ops.reduce(mine, "max").tolist(),
        "min": ops.reduce(mine, "min").tolist(),
        "padded": ops.pad_across_processes(torch.ones(rank + 1), pad_index=-1).tolist(),
        "padded_first": ops.pad_across_processes(torch.ones(rank + 1), pad_index=-1, pad_first=True).tolist(),
    }


@pytest.mark.parametrize("num_processes", [2, 3])
@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.processes
def test_each_op_gives_the_right_values(num_processes, debug):
    notebook_launcher(every_op, num_processes=num_processes, device="cpu", debug=debug)
    n = num_processes
    for rank, result in last_run().results.items():
        assert result["gather"] == [value for r in range(n) for value in (float(r), r + 0.5)]
        assert result["gather_nested"] == {"a": [float(r) for r in range(n)]}
        assert result["gather_object"] == [f"r{r}" for r in range(n)]
        assert result["broadcast"] == [1.0, 1.5]
        assert result["broadcast_object_list"] == [0, "from 0"]
        assert result["sum"] == [sum(range(n)), sum(r + 0.5 for r in range(n))]
        assert result["mean"] == pytest.approx([sum(range(n)) / n, sum(r + 0.5 for r in range(n)) / n])
        assert result["max"] == [n - 1, n - 0.5] and result["min"] == [0.0, 0.5]
        assert result["padded"] == [1.0] * (rank + 1) + [-1.0] * (n - rank - 1)
        assert result["padded_first"] == [-1.0] * (n - rank - 1) + [1.0] * (rank + 1)


MISMATCHES = {
    "notebook_launcher.ops.broadcast": "ops.broadcast(torch.ones(1, 5) if rank == 0 else torch.ones(1, 2, 5))",
    "notebook_launcher.ops.gather": "ops.gather(torch.ones(2 + rank))",
    "notebook_launcher.ops.reduce": "ops.reduce(torch.ones(3) if rank == 0 else torch.ones(3, 1))",
    "torch.distributed.all_reduce": "for step in range(4):\n"  # agreeing calls first (the same check row), then not
                                    "    dist.all_reduce(torch.ones(2, 3) if rank == 0 or step < 3 else torch.ones(3, 2))",
    "torch.distributed.all_gather_into_tensor":
        "dist.all_gather_into_tensor(torch.empty(4 * world), torch.ones(4 if rank == 0 else 2))",
}


def mismatch(statement):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()  # noqa: F841 - used by the statements
    exec(statement)


@pytest.mark.parametrize("operation", list(MISMATCHES))
@pytest.mark.parametrize("num_processes", [2, 3])
@pytest.mark.processes
def test_a_shape_mismatch_in_debug_mode_fails_every_rank_at_once(operation, num_processes):
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(mismatch, args=(MISMATCHES[operation],), num_processes=num_processes, device="cpu",
                          debug=True, timeout=60)
    message = str(caught.value)
    assert "DistributedOperationException: Cannot apply desired operation due to shape mismatches. All shapes " \
           "across devices must be valid." in message
    assert f"\nOperation: `{operation}`\nInput shapes:\n  - Process 0: [" in message
    assert f"  - Process {num_processes - 1}: [" in message
    assert "in mismatch" in message  # each rank's call site
    run = last_run()
    assert sorted(run.failures) == list(range(num_processes))
    assert {failure.type for failure in run.failures.values()} == {"DistributedOperationException"}
    times = [failure.time for failure in run.failures.values()]
    assert max(times) - min(times) < 1.0  # every rank, at once: nobody waits for a timeout
    mismatch_events = [e for e in run.events if e.kind == "shape_mismatch"]
    assert len(mismatch_events) == 1  # told once, not once per rank
    assert "the same DistributedOperationException" in message


@pytest.mark.processes
def test_the_guides_broadcast_example_gives_the_exact_message(capsys):
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(mismatch, args=(MISMATCHES["notebook_launcher.ops.broadcast"],), num_processes=2,
                          device="cpu", debug=True)
    assert capsys.readouterr().err.count("failed: DistributedOperationException") == 1  # shown once, not per rank
    expected = ("Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid."
                "\n\nOperation: `notebook_launcher.ops.broadcast`\nInput shapes:\n  - Process 0: [1, 5]\n"
                "  - Process 1: [1, 2, 5]\nCall sites:\n")
    assert expected in str(caught.value)
    event = next(e for e in last_run().events if e.kind == "shape_mismatch")
    assert event.data["shapes"] == [[1, 5], [1, 2, 5]] and event.data["dtypes"] == ["float32", "float32"]


@pytest.mark.processes
def test_accelerates_gather_inside_our_worker_is_checked():
    def accelerate_gather():
        from accelerate import Accelerator

        accelerator = Accelerator()
        accelerator.gather(torch.ones(2 + accelerator.process_index))

    with pytest.raises(RankFailedError, match="DistributedOperationException"):
        notebook_launcher(accelerate_gather, num_processes=2, device="cpu", debug=True, timeout=60)
    assert "Cannot apply desired operation due to shape mismatches" in last_run().root_cause.message


@pytest.mark.processes
def test_different_operations_on_different_ranks_are_named():
    def diverge():
        import torch.distributed as dist

        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(2))
        else:
            dist.broadcast(torch.ones(2), src=0)

    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(diverge, num_processes=2, device="cpu", debug=True, timeout=60)
    message = str(caught.value)
    assert "the processes called different collective operations" in message
    assert "Process 0: torch.distributed.all_reduce at" in message
    assert "Process 1: torch.distributed.broadcast at" in message


def same_numel_different_shape():
    """gloo happily all_reduces [2, 3] with [3, 2] (same size): only the debug check notices."""
    import torch.distributed as dist

    dist.all_reduce(torch.ones(2, 3) if dist.get_rank() == 0 else torch.ones(3, 2))
    return "not checked"


def debug_caught(**launch) -> bool:
    try:
        notebook_launcher(same_numel_different_shape, num_processes=2, device="cpu", timeout=60, **launch)
    except RankFailedError as error:
        assert error.failure.type == "DistributedOperationException"
        return True
    return False


@pytest.mark.parametrize("spelling", ["1", "true", "TRUE", "yes", "on", "y", "t", "Yes"])
@pytest.mark.processes
def test_every_spelling_of_the_environment_variable_switches_debug_on(monkeypatch, spelling):
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", spelling)
    assert debug_caught()


@pytest.mark.processes
def test_debug_switches_keyword_yaml_and_overrides(monkeypatch, tmp_path):
    assert not debug_caught()
    assert debug_caught(debug=True)
    config = tmp_path / "config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndebug: true\nmixed_precision: 'no'\n")
    assert debug_caught(config_file=str(config))
    monkeypatch.setenv("ACCELERATE_CONFIG_FILE", str(config))
    assert debug_caught()
    monkeypatch.delenv("ACCELERATE_CONFIG_FILE")
    default = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("debug: true\n")
    assert debug_caught()
    default.unlink()
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "true")
    assert not debug_caught(debug=False)  # the keyword wins over the environment
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "no")
    assert not debug_caught()


@pytest.mark.processes
def test_debug_mode_switched_on_inside_the_worker():
    def switch_on_then_mismatch():
        os.environ["ACCELERATE_DEBUG_MODE"] = "yes"
        return same_numel_different_shape()

    with pytest.raises(RankFailedError, match="DistributedOperationException"):
        notebook_launcher(switch_on_then_mismatch, num_processes=2, device="cpu", timeout=60)


@pytest.mark.processes
def test_hang_where_rank_1_leaves_the_loop_early_is_diagnosed():
    def loop():
        import torch.distributed as dist

        for step in range(10):
            if dist.get_rank() == 1 and step == 5:
                break  # rank 1 leaves early: rank 0 waits in all_reduce #6 forever
            dist.all_reduce(torch.ones(1))
        return "left"

    timeout = 5
    started = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(loop, num_processes=2, device="cpu", timeout=timeout)
    assert time.monotonic() - started < timeout + 2 + 3  # diagnosed within timeout + 2 s (+ start and teardown)
    message = str(caught.value)
    assert message.startswith("The ranks stopped making progress: rank 1 had finished its function (last "
                              "collective: all_reduce #5 at")
    assert "rank 0: waiting" in message and "in all_reduce #6 at" in message
    assert "Python stacks of rank 0:" in message and "in loop" in message
    assert last_run().status == "hung"
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.processes
def test_hang_where_a_rank_never_reaches_the_collective_is_diagnosed_at_the_timeout():
    def stuck_elsewhere():
        import torch.distributed as dist

        if dist.get_rank() == 1:
            time.sleep(60)  # stuck in its own code
        dist.all_reduce(torch.ones(1))

    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(stuck_elsewhere, num_processes=2, device="cpu", timeout=4)
    message = str(caught.value)
    assert "rank 1 is not in any collective: busy or stuck in its own code" in message
    assert "rank 0: waiting" in message and "in all_reduce #1" in message
    assert "in stuck_elsewhere" in message  # rank 1's stack shows where it is


@pytest.mark.processes
def test_trigger_stops_every_rank_at_the_same_step(capsys):
    def train():
        import torch.distributed as dist

        for step in range(100):
            should_do_breakpoint = dist.get_rank() == 1 and step == 7
            if should_do_breakpoint:
                set_trigger()
            if check_trigger():
                break
        return step

    notebook_launcher(train, num_processes=3, device="cpu")
    assert last_run().results == {0: 7, 1: 7, 2: 7}
    out = capsys.readouterr().out
    assert "[rank 1] set_trigger() at " in out and "in train: the next check_trigger() returns True" in out
    trigger = next(e for e in last_run().events if e.kind == "trigger")
    assert trigger.rank == 1 and "in train" in trigger.data["call_site"]


def test_ops_and_trigger_outside_a_launch_are_single_process():
    assert ops.gather(torch.ones(2)).tolist() == [1.0, 1.0]
    assert ops.reduce(torch.ones(2), "mean").tolist() == [1.0, 1.0]
    set_trigger()
    assert check_trigger() is True and check_trigger() is False


@pytest.mark.processes
def test_ops_work_under_torchrun(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, torch.distributed as dist
        from notebook_launcher.rank import collectives as ops
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        result = f"gathered {ops.gather(torch.tensor([rank])).tolist()} sum {ops.reduce(torch.ones(1)).item()}"
        open(f"{sys.argv[1]}-{rank}.txt", "w").write(result)
        dist.destroy_process_group()
    """))
    completed = run_torchrun(script, tmp_path / "out")
    assert completed.returncode == 0, completed.stderr
    for rank in (0, 1):
        assert (tmp_path / f"out-{rank}.txt").read_text() == "gathered [0, 1] sum 2.0"


def raw_collectives():
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN),
                     ("product", dist.ReduceOp.PRODUCT)):
        tensor = torch.tensor([rank + 1.0, 2.0 * rank])
        dist.all_reduce(tensor, op=op)
        results[name] = tensor.tolist()
    integers = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(integers)
    results["int_sum"] = integers.tolist()
    gathered = [torch.empty(2, dtype=torch.bfloat16) for _ in range(world)]
    dist.all_gather(gathered, torch.full((2,), float(rank), dtype=torch.bfloat16))
    results["all_gather"] = [t.float().tolist() for t in gathered]
    output = torch.empty(world * 3)  # gloo wants the flat form
    dist.all_gather_into_tensor(output, torch.full((3,), float(rank)))
    results["into_tensor"] = output.view(world, 3).tolist()
    big = torch.full((1000,), float(rank))  # larger than what travels with the check: a second round
    dist.all_reduce(big)
    results["big"] = big[:2].tolist()
    return results


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.processes
def test_raw_collectives_give_the_same_values_with_and_without_debug_mode(debug):
    notebook_launcher(raw_collectives, num_processes=3, device="cpu", debug=debug)
    for result in last_run().results.values():
        assert result["sum"] == [6.0, 6.0] and result["max"] == [3.0, 4.0] and result["min"] == [1.0, 0.0]
        assert result["product"] == [6.0, 0.0] and result["int_sum"] == [6]
        assert result["all_gather"] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
        assert result["into_tensor"] == [[0.0] * 3, [1.0] * 3, [2.0] * 3]
        assert result["big"] == [3.0, 3.0]


def legal_but_uneven_calls():
    import torch.distributed as dist

    rank = dist.get_rank()
    tensor = torch.ones(3)
    if rank == 0:  # ranks may differ in async_op: every rank must still take the same path
        dist.all_reduce(tensor, async_op=True).wait()
    else:
        dist.all_reduce(tensor)
    leaf = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        dist.all_reduce(leaf)
    subgroup = dist.new_group([0, 1])
    small = torch.ones(1)
    dist.all_reduce(small, group=subgroup)  # rank 2 is not in it: a no-op there
    return tensor.tolist(), leaf.tolist(), small.tolist()


@pytest.mark.processes
def test_legal_calls_that_differ_between_ranks_still_work_in_debug_mode():
    notebook_launcher(legal_but_uneven_calls, num_processes=3, device="cpu", debug=True, timeout=60)
    results = last_run().results
    assert results[0] == results[1] == ([3.0] * 3, [3.0] * 2, [2.0])
    assert results[2] == ([3.0] * 3, [3.0] * 2, [1.0])


@pytest.mark.parametrize("statement, words", [
    ("dist.all_reduce(torch.ones(2), op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)",
     "Operation: `torch.distributed.all_reduce`"),
    ("dist.broadcast_object_list([1, 2] if rank == 0 else [1], src=0)",
     "Operation: `torch.distributed.broadcast_object_list`"),
    ("ops.broadcast(torch.ones(2), from_process=rank)", "Operation: `notebook_launcher.ops.broadcast`"),
])
@pytest.mark.processes
def test_disagreements_beyond_shapes_are_caught(statement, words):
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(mismatch, args=(statement,), num_processes=2, device="cpu", debug=True, timeout=60)
    assert "DistributedOperationException" in str(caught.value) and words in str(caught.value)


@pytest.mark.processes
def test_a_long_run_reaching_its_timeout_is_not_called_a_divergence():
    def busy():
        import torch.distributed as dist

        for _ in range(1000):
            dist.all_reduce(torch.ones(1))  # in and out of collectives all the time
            time.sleep(0.01)

    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(busy, num_processes=2, device="cpu", timeout=2)
    message = str(caught.value)
    assert message.startswith("The run did not finish within timeout=2 s, so every rank was stopped.\n\nrank 0:")
    assert "diverged" not in message and "stopped making progress" not in message


def carried_in_every_form():
    import torch.distributed as dist

    rank = dist.get_rank()
    results = {}
    for dtype in (torch.float32, torch.float64, torch.int8, torch.int64, torch.bool, torch.complex128):
        tensor = (torch.arange(6) + rank).to(dtype).reshape(2, 3)
        results[f"gather {dtype}"] = ops.gather(tensor)
        summed = tensor.clone()
        if dtype is not torch.bool:
            dist.all_reduce(summed)
        results[f"all_reduce {dtype}"] = summed
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        reduced = torch.tensor([1.5, -2.0, 3.0], dtype=torch.float64) * (rank + 2)
        dist.all_reduce(reduced, op=op)
        results[f"all_reduce {op}"] = reduced
    with_grad = torch.full((3,), rank + 1.0, requires_grad=True)  # (reduced in place, outside autograd)
    dist.all_reduce(with_grad)
    results["all_reduce, requires grad"] = with_grad.detach()
    for size in (3, 3, 4, 3):  # the same row again and again, then another, then the first again
        results[f"gather of {size} after the last"] = ops.gather(torch.arange(float(size)) + rank)
    results["0-dim"] = ops.gather(torch.tensor(rank + 0.5))
    results["empty"] = ops.gather(torch.empty(0, 4))
    results["strided"] = ops.gather(torch.arange(10.0)[::3] + rank)
    first = ops.gather(torch.full((3,), float(rank)))
    ops.gather(torch.full((3,), 100.0))  # the next check reuses its rows: the first result must stay as it was
    results["kept"] = first
    output = torch.empty(2 * 4, dtype=torch.float64)
    dist.all_gather_into_tensor(output, torch.full((4,), rank + 0.25, dtype=torch.float64))
    results["into_tensor"] = output
    results["ops.broadcast"] = ops.broadcast(torch.arange(4.0) * (rank + 1), from_process=1)
    raw = torch.full((2, 2), rank, dtype=torch.int32)
    dist.broadcast(raw, src=1)
    results["broadcast"] = raw
    return {name: value.tolist() for name, value in results.items()}


@pytest.mark.processes
def test_small_tensors_that_travel_with_the_check_come_back_exactly_as_without_it():
    notebook_launcher(carried_in_every_form, num_processes=2, device="cpu", debug=False)
    expected = last_run().results
    notebook_launcher(carried_in_every_form, num_processes=2, device="cpu", debug=True)
    assert last_run().results == expected
    assert expected[0]["kept"] == [0.0] * 3 + [1.0] * 3 and expected[0]["0-dim"] == [0.5, 1.5]
