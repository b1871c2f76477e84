"""The worker-side modules: what they send once a worker has connected them, and what they do unconnected (in the
kernel, in a script). Real ranks on gloo; trigger and shape-mismatch events are in test_ops.py."""

import pytest
import torch

from notebook_launcher import (
    RankFailedError,
    check_trigger,
    find_executable_batch_size,
    last_run,
    notebook_launcher,
    report,
    set_trigger,
)
from notebook_launcher.rank import collectives as ops  # (any_rank: the rank side's own collective)

TRIGGER = "notebook_launcher.check_trigger"


@pytest.fixture(autouse=True)
def no_debug_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    monkeypatch.delenv("ACCELERATE_CONFIG_FILE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no default Accelerate config file from this machine


def fits_above(limit: int):
    """A function decorated as users do, whose batch fits only up to ``limit``: larger ones ask the allocator for
    a terabyte, a real out-of-memory error."""
    tried = []

    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size):
        tried.append(batch_size)
        torch.empty(2**40 if batch_size > limit else 1, dtype=torch.uint8)
        return batch_size

    return train, tried


def reports_three_steps():
    import torch.distributed as dist

    rank = dist.get_rank()
    for step in range(1, 4):
        report(step=step, total=3, loss=torch.tensor(0.5 * step), rank=rank)
    train, _ = fits_above(8)
    return train()


@pytest.mark.processes
def test_report_and_each_try_of_the_batch_size_arrive_as_events_of_their_rank():
    notebook_launcher(reports_three_steps, num_processes=2, device="cpu")
    run = last_run()
    assert run.results == {0: 8, 1: 8}
    for rank in (0, 1):
        progress = [(e.data["step"], e.data["total"], e.data["metrics"]) for e in run.events
                    if e.kind == "progress" and e.rank == rank]
        assert progress == [(step, 3, {"loss": 0.5 * step, "rank": float(rank)}) for step in (1, 2, 3)]
        tries = [e.data for e in run.events if e.kind == "batch_size" and e.rank == rank]
        assert [data["batch_size"] for data in tries] == [8]
        assert tries[0]["key"].endswith("fits_above.<locals>.train")


def flags_of_every_rank():
    import torch.distributed as dist

    rank = dist.get_rank()
    return ops.any_rank(rank == 2, TRIGGER), ops.any_rank(False, TRIGGER)


@pytest.mark.processes
def test_any_rank_is_true_on_every_rank_when_one_rank_says_so():
    notebook_launcher(flags_of_every_rank, num_processes=3, device="cpu")
    assert last_run().results == {0: (True, False), 1: (True, False), 2: (True, False)}


def checks_the_trigger_on_rank_0_only():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        check_trigger()
    else:
        dist.all_reduce(torch.ones(1))


@pytest.mark.processes
def test_check_trigger_on_one_rank_against_another_collective_is_named_in_debug_mode():
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(checks_the_trigger_on_rank_0_only, num_processes=2, device="cpu", debug=True, timeout=60)
    message = str(caught.value)
    assert "DistributedOperationException" in message and "called different collective operations" in message
    assert "Process 0: notebook_launcher.check_trigger at " in message and "in checks_the_trigger_on_rank_0_only" in message
    assert "Process 1: torch.distributed.all_reduce at " in message


@pytest.mark.processes
def test_unconnected_modules_work_in_the_kernel_even_after_a_launch(capsys):
    notebook_launcher(reports_three_steps, num_processes=2, device="cpu")  # connects the workers' copies only
    capsys.readouterr()
    report(step=1, total=3, loss=torch.tensor(0.5))  # checked, then nothing
    with pytest.raises(TypeError, match="report"):
        report(step=-1)
    set_trigger()
    assert check_trigger() is True and check_trigger() is False
    assert ops.any_rank(True, TRIGGER) is True and ops.any_rank(0, TRIGGER) is False
    train, tried = fits_above(2)
    assert train() == 2 and tried == [8, 4, 2]  # retried here, never handed to a kernel as a restart
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "out of memory at batch size 8" in captured.err and "trying 4" in captured.err


def test_any_rank_names_an_operation_the_check_knows():
    with pytest.raises(ValueError, match="agreement.OPERATIONS"):
        ops.any_rank(True, "my_module.stop")
