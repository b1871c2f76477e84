"""The panel's state tells each part of a run's story once, from real launches (real processes, gloo on CPU):
a timed-out run's stacks, the live balance of every rank that has reported, an out-of-memory retry as a retry."""

from __future__ import annotations

import json
import time

import pytest

from notebook_launcher import LaunchTimeoutError, find_executable_batch_size, last_run, notebook_launcher, report
from notebook_launcher.display.replay import read_events
from notebook_launcher.display.state import RunState
from notebook_launcher.rank import balance_meter
from notebook_launcher.schema.events import BALANCE


def launch(function, *args, **options):
    options.setdefault("timeout", 60)
    return notebook_launcher(function, args=args, num_processes=2, device="cpu", display="panel", **options)


def one_waits_one_sleeps():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins: it is busy in its own code
    else:
        time.sleep(120)


def steady(steps):
    import torch
    import torch.distributed as dist

    for step in range(1, steps + 1):
        time.sleep(0.02)
        dist.all_reduce(torch.ones(1))
        report(step=step, total=steps)
    return "done"


def runs_out_of_memory_on_rank_1():
    import torch
    import torch.distributed as dist

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size):
        if batch_size > 32 and dist.get_rank() == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size

    return train()


def _count(text: str, state: dict) -> int:
    return json.dumps(state).count(json.dumps(text)[1:-1])


@pytest.mark.processes
def test_a_timed_out_runs_final_state_carries_each_stack_once():
    with pytest.raises(LaunchTimeoutError) as caught:
        launch(one_waits_one_sleeps, timeout=10, hang_warning=2)
    state = last_run().panel_state
    failure = state["failure"]
    assert state["status"] == "timed out" and failure["kind"] == "timeout"
    assert set(failure["stacks"]) == {"0", "1"}
    for rank, stack in failure["stacks"].items():
        frames = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
        assert any("one_waits_one_sleeps" in frame for frame in frames)
        assert _count(stack, state) == 1, f"rank {rank}'s stack is told more than once"
        own = next(frame for frame in frames if "one_waits_one_sleeps" in frame)
        assert _count(own, state) == 1 and own in str(caught.value)  # (the error itself keeps them all)
    assert failure["verdict"].startswith("The run did not finish within timeout=10 s")
    assert "rank 0: waiting" in failure["message"] and "Python stacks" not in failure["message"]
    assert state["hang"] is None  # the notice is history now, without its stacks: the failure tells where
    assert all(not notice["stacks"] and "Python stacks" not in notice["text"] for notice in state["hangs"])


@pytest.mark.processes
def test_every_running_state_names_every_rank_that_has_reported_its_balance(monkeypatch):
    monkeypatch.setattr(balance_meter, "INTERVAL_S", 0.3)  # the forked workers inherit it
    assert launch(steady, 60) == "done"
    run = last_run()
    state = RunState("replayed", run.run_dir, "cpu", "gloo", "fork", 2, 2, [0, 1])
    reported, both_named = set(), 0
    for event in read_events(run.run_dir):  # the run's own events, as the panel got them, read as it reads
        state.observe(event)
        reported |= {str(event.rank)} if event.kind == BALANCE else set()
        shown = state.to_json()
        if shown["status"] == "running" and reported:
            assert set(shown["balance"]["ranks"]) == reported
            both_named += len(reported) == 2
    assert both_named > 0


@pytest.mark.processes
def test_an_out_of_memory_retry_is_a_retry_in_the_columns_with_a_divider_per_attempt():
    assert launch(runs_out_of_memory_on_rank_1) == 32
    state = last_run().panel_state
    assert state["attempt"] == 2 and state["status"] == "finished"
    first, second = state["ranks"]
    assert [line["text"] for line in second["lines"] if line["kind"] == "retry"] == [
        "out of memory at batch size 64: retried at batch size 32"]
    assert not any(line["text"].startswith("failed") for column in state["ranks"] for line in column["lines"])
    for column in (first, second):
        assert [line["text"] for line in column["lines"] if line["kind"] == "attempt"] == [
            "attempt 2 at batch size 32"]


@pytest.mark.kernel
def test_the_error_below_the_panel_names_cells_as_ipython_does_without_ipythons_own_frames():
    """A real kernel: the error output of a failed launch (``_render_traceback_``) names the cell the rank's
    function came from ``cell In[1], line N``, never ``/tmp/ipykernel_...``, and leaves out IPython's frames."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    cells = ['''\
import torch.distributed as dist
from notebook_launcher import notebook_launcher

def fails():
    if dist.get_rank() == 1:
        raise ValueError("bad value on rank 1")
''', 'notebook_launcher(fails, num_processes=2, device="cpu", timeout=60)']
    notebook = new_notebook(cells=[new_code_cell(code) for code in cells], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    NotebookClient(notebook, timeout=120, allow_errors=True).execute()  # (it stops its kernel when done)
    (error,) = [out for out in notebook.cells[1].outputs if out.output_type == "error"]
    shown = "\n".join(error.traceback)
    assert error.ename == "RankFailedError" and "bad value on rank 1" in shown
    assert "cell In[1], line 6, in fails" in shown and "cell In[2], line 1" in shown
    assert "/tmp/ipykernel_" not in shown and "interactiveshell.py" not in shown and "run_code" not in shown
