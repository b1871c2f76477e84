"""The stall watchdog: a hang notice when no rank makes progress while one waits in a collective; the run goes on.

Real 2-3 rank CPU launches (gloo), a short ``hang_warning`` so that each test stays short; and one real Jupyter
kernel, where a notebook cell is named as IPython names it.
"""

from __future__ import annotations

import os
import re
import time

import pytest
import torch
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

import notebook_launcher as package
from notebook_launcher import LaunchArgumentError, LaunchTimeoutError, last_run, notebook_launcher, report

PACKAGE_DIR = os.path.dirname(os.path.abspath(package.__file__)) + os.sep
CUT_LINE = re.compile(r"\(\d+ frames of notebook_launcher's own below these are not shown; the run log has them\)")


def notices(run=None):
    return [event.data for event in (run or last_run()).events if event.kind == "hang_notice"]


def assert_only_users_frames(text: str) -> None:
    """No frame of notebook_launcher's own in what a user is shown, and the one line saying they were cut."""
    assert CUT_LINE.search(text), text
    frames = [line for line in text.splitlines() if line.strip().startswith("File ")]
    assert frames, text
    assert not [line for line in frames if PACKAGE_DIR in line], text


def busy_then_all_reduce(seconds):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        end = time.time() + seconds
        while time.time() < end:  # busy in its own Python code
            pass
    dist.all_reduce(torch.ones(1))
    return dist.get_rank()


@pytest.mark.processes
def test_a_rank_busy_in_python_while_the_other_waits_gets_a_notice_then_the_run_finishes(capsys):
    result = notebook_launcher(busy_then_all_reduce, args=(8,), num_processes=2, device="cpu", hang_warning=3,
                               display="text")
    run = last_run()
    assert result == 0 and run.status == "finished" and run.results == {0: 0, 1: 1}
    opened, cleared = notices(run)  # one notice for the stall, one when it ended: not one every second
    assert opened["state"] == "open" and cleared["state"] == "cleared"
    assert opened["quiet_s"] >= 3
    assert opened["ranks"]["0"]["state"] == "waiting"
    assert re.fullmatch(r"waiting \d+ s in all_reduce #1 at .*test_hang_watchdog\.py:\d+ in busy_then_all_reduce",
                        opened["ranks"]["0"]["text"])
    assert opened["ranks"]["1"]["state"] == "busy"
    assert re.fullmatch(r"busy in its own code at .*test_hang_watchdog\.py:\d+ in busy_then_all_reduce",
                        opened["ranks"]["1"]["text"])
    assert opened["diverged"] == 1
    assert set(opened["stacks"]) == {"0", "1"}
    assert "in all_reduce" in opened["stacks"]["0"] and "in busy_then_all_reduce" in opened["stacks"]["1"]
    for stack in opened["stacks"].values():
        assert_only_users_frames(stack)
    text = opened["text"].splitlines()
    assert re.fullmatch(r"possible hang: no rank has made progress for \d+ s", text[0])
    assert text[1].startswith("  rank 0: waiting ") and text[2].startswith("  rank 1: busy in its own code at ")
    assert "rank 1 diverged" in opened["text"]
    assert text[-1] == ("The run goes on; stop it with the stop button (interrupt), or pass timeout= to end such "
                        "a run by itself.")
    assert re.fullmatch(r"progress resumed after \d+ s", cleared["text"])
    assert cleared["quiet_s"] >= opened["quiet_s"]
    printed = capsys.readouterr().out  # the text display prints the block as it is, without a rank prefix
    assert opened["text"] + "\n" in printed and cleared["text"] + "\n" in printed
    # the run log keeps the raw stack dumps whole (stderr lines, with the frames the notice leaves out)
    stderr = [event.data["text"] for event in run.events if event.kind == "stream"
              and event.data.get("stream") == "stderr"]
    assert any(PACKAGE_DIR in line for line in stderr)


@pytest.mark.processes
def test_steady_steps_give_no_notice():
    def steady():
        import torch.distributed as dist

        for _ in range(12):
            dist.all_reduce(torch.ones(1))
            time.sleep(0.5)

    notebook_launcher(steady, num_processes=2, device="cpu", hang_warning=2, display="text")
    assert last_run().status == "finished"
    assert notices() == [], notices()[0]["text"]


@pytest.mark.processes
def test_report_steps_are_progress_too():
    def reporting():
        import torch.distributed as dist

        if dist.get_rank() == 1:
            for step in range(10):  # no collective, but it reports its steps
                time.sleep(0.5)
                report(step=step)
        dist.all_reduce(torch.ones(1))

    notebook_launcher(reporting, num_processes=2, device="cpu", hang_warning=3, display="text")
    assert last_run().status == "finished"
    assert notices() == [], notices()[0]["text"]


@pytest.mark.processes
def test_hang_warning_none_turns_the_watchdog_off():
    notebook_launcher(busy_then_all_reduce, args=(5,), num_processes=2, device="cpu", hang_warning=None,
                      display="text")
    assert last_run().status == "finished" and notices() == []


@pytest.mark.parametrize("value, error", [(0, LaunchArgumentError), (-1, LaunchArgumentError), ("30", TypeError)])
@pytest.mark.processes
def test_hang_warning_must_be_a_positive_number_or_none(value, error):
    with pytest.raises(error, match="hang_warning"):
        notebook_launcher(busy_then_all_reduce, args=(0,), num_processes=2, device="cpu", hang_warning=value)


@pytest.mark.processes
def test_three_ranks_the_diverging_one_is_named_and_the_timeout_still_stops_the_run():
    def one_rank_elsewhere():
        import torch.distributed as dist

        if dist.get_rank() == 1:
            time.sleep(30)  # the two others wait for it in the barrier
        dist.barrier()

    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(one_rank_elsewhere, num_processes=3, device="cpu", hang_warning=2, timeout=5,
                          display="text")
    run = last_run()
    assert run.status == "timed out"
    (opened,) = notices(run)
    assert opened["diverged"] == 1
    assert opened["ranks"]["0"]["text"].startswith("waiting ") and " in barrier #1 at " in opened["ranks"]["0"]["text"]
    assert opened["ranks"]["2"]["state"] == "waiting"
    assert opened["ranks"]["1"]["text"].startswith("busy in its own code at ")
    assert "the run goes on until timeout=5 s" in opened["text"].lower()
    message = str(caught.value)
    assert message.startswith("The run did not finish within timeout=5 s")
    assert "Python stacks of rank 1:" in message and "in one_rank_elsewhere" in message
    assert_only_users_frames(message)


@pytest.mark.processes
def test_ddp_with_uneven_batches_a_notice_names_rank_0_in_ddp_and_rank_1_at_its_barrier():
    """The most common real hang: rank 1 has fewer batches, leaves the loop and waits at a barrier while rank 0
    is in DDP's backward (C++, where debug mode's check cannot reach). The notice names both; the run goes on
    until the timeout stops it."""
    def uneven_batches():
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(torch.nn.Linear(4, 1))
        for _ in range(5 if dist.get_rank() == 0 else 3):
            model(torch.ones(8, 4)).sum().backward()
        dist.barrier()

    started = time.monotonic()
    with pytest.raises(LaunchTimeoutError):
        notebook_launcher(uneven_batches, num_processes=2, device="cpu", hang_warning=2, timeout=20,
                          display="text")
    run = last_run()
    (opened,) = notices(run)
    notice_at = next(e.time for e in run.events if e.kind == "hang_notice") - started
    assert notice_at < 20  # before the timeout (the ranks are stuck about 2 s in, 10 s on a loaded machine) ...
    assert run.status == "timed out"  # ... and the run went on after it, until timeout= stopped it
    assert opened["ranks"]["0"]["state"] == "in_ddp"
    assert re.fullmatch(r"in DDP's gradient all_reduce \(step 4\) at .*test_hang_watchdog\.py:\d+ in uneven_batches",
                        opened["ranks"]["0"]["text"])
    assert re.fullmatch(r"waiting \d+ s in barrier #\d+ at .*test_hang_watchdog\.py:\d+ in uneven_batches",
                        opened["ranks"]["1"]["text"])
    assert "in uneven_batches" in opened["stacks"]["0"] and "in barrier" in opened["stacks"]["1"]
    assert_only_users_frames(opened["text"])


@pytest.mark.processes
def test_a_rank_computing_between_collectives_for_less_than_hang_warning_gets_no_notice():
    def computes_then_reduces():
        import torch.distributed as dist

        for _ in range(2):
            if dist.get_rank() == 0:
                end = time.time() + 2.5  # rank 1 waits in all_reduce meanwhile
                while time.time() < end:
                    pass
            dist.all_reduce(torch.ones(1))

    notebook_launcher(computes_then_reduces, num_processes=2, device="cpu", hang_warning=4, display="text")
    assert last_run().status == "finished" and notices() == []


CELLS = [
    "import time, torch\nfrom notebook_launcher import notebook_launcher, last_run",
    ("def stuck():\n"
     "    import torch.distributed as dist\n"
     "    if dist.get_rank() == 1:\n"
     "        end = time.time() + 5\n"
     "        while time.time() < end:\n"
     "            pass\n"
     "    dist.all_reduce(torch.ones(1))"),
    ("notebook_launcher(stuck, num_processes=2, device='cpu', hang_warning=2, display='text')\n"
     "print('NOTICE', [e.data['text'] for e in last_run().events if e.kind == 'hang_notice'][0])"),
    "%load_ext notebook_launcher",
    ("%%accelerate -n 2 --text --no-return --hang-warning 2\n"
     "import time, torch, torch.distributed as dist\n"
     "if dist.get_rank() == 1:\n"
     "    end = time.time() + 5\n"
     "    while time.time() < end:\n"
     "        pass\n"
     "dist.all_reduce(torch.ones(1))"),
    "print('MAGIC', [e.data['text'] for e in last_run().events if e.kind == 'hang_notice'][0])",
]


@pytest.mark.slow
@pytest.mark.kernel
def test_in_a_kernel_a_notice_names_the_notebook_cell_and_the_magic_takes_hang_warning(tmp_path):
    notebook = new_notebook(cells=[new_code_cell(source) for source in CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    out = "".join(output.get("text", "") for output in notebook.cells[2].outputs if output["output_type"] == "stream")
    notice = out[out.index("NOTICE"):]
    assert re.search(r"rank 0: waiting \d+ s in all_reduce #1 at cell In\[2\], line 7 in stuck", notice), out
    assert re.search(r"rank 1: busy in its own code at cell In\[2\], line [56] in stuck", notice), out
    assert re.search(r'cell In\[2\], line 7 in stuck', notice)  # in the stacks too
    assert "ipykernel_" not in notice
    # a %%accelerate cell (its first line, the magic's, is line 1), with the watchdog set by --hang-warning
    out = "".join(output.get("text", "") for output in notebook.cells[5].outputs if output["output_type"] == "stream")
    notice = out[out.index("MAGIC"):]
    assert re.search(r"rank 0: waiting \d+ s in all_reduce #1 at cell In\[\d+\], line 7 in <module>", notice), out
    assert re.search(r"rank 1: busy in its own code at cell In\[\d+\], line [56] in <module>", notice), out
    assert "<accelerate cell" not in notice


@pytest.mark.processes
def test_the_automatic_hang_stop_is_kept_and_its_stacks_are_the_users():
    def leaves_early():
        import torch.distributed as dist

        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))  # rank 1 has returned: it never joins

    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(leaves_early, num_processes=2, device="cpu", display="text")
    assert last_run().status == "hung" and notices() == []  # stopped 2 s after rank 1 finished, before any notice
    message = str(caught.value)
    assert "Python stacks of rank 0:" in message and "in leaves_early" in message
    assert_only_users_frames(message)


def test_a_rank_that_waited_long_for_one_that_just_finished_is_not_taken_for_hung(tmp_path):
    """Rank 0 waited 5 s in all_reduce for rank 1, which then joined it and finished at once: rank 0 needs a
    moment to see its all_reduce complete. The automatic stop counts the grace from the finish, not from the
    collective's start (it stopped such healthy runs when the kernel saw the finish first)."""
    from notebook_launcher.schema.progress_record import ProgressRecord
    from notebook_launcher.supervision.hangs import HANG_GRACE_S, HangWatch

    watch = HangWatch(str(tmp_path))
    ranks = [ProgressRecord(watch.path_for(rank)) for rank in (0, 1)]
    ranks[0].enter("all_reduce", "train.py:9 in main")
    entered = watch.read()[0]["since"]
    finished = entered + 5.0
    assert not watch.is_hang({1}, finished)
    assert not watch.is_hang({1}, finished + HANG_GRACE_S - 0.1)
    assert watch.is_hang({1}, finished + HANG_GRACE_S)  # still inside after the grace: it will never complete
    ranks[0].leave()
    assert not watch.is_hang({1}, finished + HANG_GRACE_S + 1)
    for record in ranks:
        record.close()
    watch.close()
