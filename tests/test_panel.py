"""The run panel's data and fallbacks, from real launches (real processes, real collectives).

What the JupyterLab extension draws is ``run.panel_state`` (the MIME payload, labextension/SCHEMA.md); what other
frontends show is its ``text/html`` and ``text/plain``. Live updates in a real kernel are in test_panel_kernel.py.
"""

from __future__ import annotations

import html
import json
import sys
import time

import pytest

from notebook_launcher import (LaunchArgumentError, LaunchTimeoutError, RankFailedError, find_executable_batch_size,
                               last_run, notebook_launcher, report, set_trigger)
from notebook_launcher.display.fallback import render_html, render_text
from notebook_launcher.display.panel import PanelDisplay
from notebook_launcher.display.state import MIME_TYPE, RunState


def launch(function, *args, **options):
    options.setdefault("num_processes", 2)
    options.setdefault("device", "cpu")
    options.setdefault("timeout", 60)
    return notebook_launcher(function, args=args, display="panel", **options)


# -- workers ---------------------------------------------------------------------------------------------------------
def chatty(count):
    import logging
    import torch.distributed as dist

    rank = dist.get_rank()
    logger = logging.getLogger("chatty")
    logger.setLevel(logging.INFO)
    for i in range(count):
        print(f"rank {rank} line {i}")
    logger.warning("careful on %d", rank)
    print("<img src=x onerror=alert(1)>", file=sys.stderr)
    return rank


def reporting(steps):
    import torch.distributed as dist

    rank = dist.get_rank()
    for step in range(1, steps + 1):
        time.sleep(0.01 if rank == 0 else 0.04)  # rank 1 is the straggler
        report(step=step, total=steps, loss=1.0 / step)
    return "done"


def tqdm_loop():
    from tqdm import tqdm

    for _ in tqdm(range(20), desc="epoch", mininterval=0):
        time.sleep(0.005)


def mismatch_then_oom_then_finish():
    import torch
    import torch.distributed as dist

    from notebook_launcher import DistributedOperationException

    rank = dist.get_rank()
    try:
        dist.all_gather_into_tensor(torch.empty(8), torch.ones(4 if rank == 0 else 2))
    except DistributedOperationException:
        print("caught the shape mismatch")

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size):
        if batch_size > 32 and rank == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        print(f"training at {batch_size}")
        return batch_size

    if rank == 1:
        set_trigger()
    return train()


def fails_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad value on rank 1")
    time.sleep(30)


def leaves_early():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins


# -- tests -----------------------------------------------------------------------------------------------------------
def test_panel_has_every_rank_lines_in_order_and_its_fallbacks_escape_user_text(capsys):
    assert launch(chatty, 5) == 0
    state = last_run().panel_state
    assert state["version"] == 1 and state["status"] == "finished" and state["result"] == {"type": "int"}
    assert state["run_id"] == last_run().run_id and state["run_dir"] == last_run().run_dir
    assert (state["device"], state["backend"], state["world_size"]) == ("cpu", "gloo", 2)
    for rank in (0, 1):
        column = state["ranks"][rank]
        assert column["status"] == "finished" and column["exit_code"] == 0 and column["pid"] > 0
        stdout = [line["text"] for line in column["lines"] if line["kind"] == "stdout"]
        assert stdout == [f"rank {rank} line {i}" for i in range(5)]
        logs = [line for line in column["lines"] if line["kind"] == "log"]
        assert [(line["level"], line["logger"], line["text"]) for line in logs] == [
            ("WARNING", "chatty", f"careful on {rank}")]
        numbers = [line["n"] for line in column["lines"]]
        assert numbers == sorted(numbers)
    json.dumps(state)  # what the kernel sends must be JSON

    page = render_html(state)
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img" not in page
    plain = render_text(state)
    assert "[rank 1] <img src=x onerror=alert(1)>" in plain.splitlines()
    assert "[rank 0] WARNING chatty: careful on 0" in plain.splitlines()
    assert plain.splitlines()[-1] == "status by rank: 0 finished, 1 finished"
    assert plain in capsys.readouterr().out  # display="panel" outside Jupyter prints the final state once


def test_each_rank_keeps_its_newest_lines_and_says_how_many_are_only_in_the_run_log():
    launch(chatty, 450)
    state = last_run().panel_state
    for rank in (0, 1):
        column = state["ranks"][rank]
        assert len(column["lines"]) == 200
        assert column["lines_total"] == 452 and column["lines_dropped"] == 252
        assert column["lines"][-3]["text"] == f"rank {rank} line 449"
    plain = render_text(state)
    assert f"[rank 0] (252 earlier lines are in the run log: {state['run_dir']})" in plain
    assert len(json.dumps(state)) < 100_000  # bounded, however much the ranks print


def test_report_gives_each_rank_a_progress_bar_and_a_step_time_history_where_the_straggler_shows():
    assert launch(reporting, 20) == "done"
    state = last_run().panel_state
    fast, slow = state["ranks"]
    for column in (fast, slow):
        assert column["progress"]["step"] == 20 and column["progress"]["total"] == 20
        assert column["progress"]["metrics"] == {"loss": pytest.approx(1 / 20)}
        assert [point["step"] for point in column["history"]] == list(range(1, 21))
    assert slow["progress"]["step_time"] > fast["progress"]["step_time"]  # rank 1 sleeps 4x as long per step


def test_report_rejects_what_cannot_be_charted():
    with pytest.raises(TypeError, match=r"report\(step=...\) takes a whole number"):
        report(step=1.5)
    with pytest.raises(TypeError, match=r"report\(total=...\)"):
        report(step=1, total=0)
    with pytest.raises(TypeError, match=r"report\(loss=...\) takes a number .* not str"):
        report(step=1, loss="low")
    report(step=3, total=10, loss=0.5)  # outside a launch: checked, then nothing


def test_a_tqdm_bar_in_a_worker_becomes_its_progress_not_a_flood_of_lines():
    launch(tqdm_loop)
    state = last_run().panel_state
    for column in state["ranks"]:
        assert column["progress"]["step"] == 20 and column["progress"]["total"] == 20
        assert column["progress"]["label"] == "epoch"
        bars = [line["text"] for line in column["lines"] if "|" in line["text"]]
        assert len(bars) == 1 and bars[0].startswith("epoch: 100%|")  # only the bar's final state is a line
    assert all("\r" not in line for line in last_run().output())


def test_shape_mismatch_card_oom_retry_row_and_trigger_are_in_the_panel():
    assert launch(mismatch_then_oom_then_finish, debug=True) == 32
    state = last_run().panel_state
    assert state["status"] == "finished" and state["batch_size"] == 32 and state["attempt"] == 2
    assert [card["attempt"] for card in state["shape_mismatches"]] == [1, 2]  # one per try, not one per rank
    card = state["shape_mismatches"][0]
    assert card["operation"] == "torch.distributed.all_gather_into_tensor"
    assert [(p["rank"], p["shape"], p["dtype"]) for p in card["processes"]] == [(0, [4], "float32"),
                                                                                  (1, [2], "float32")]
    assert all("mismatch_then_oom_then_finish" in p["call_site"] for p in card["processes"])
    (retry,) = state["oom_retries"]
    assert (retry["batch_size"], retry["new_batch_size"], retry["ranks"]) == (64, 32, [1])
    assert "CUDA out of memory" in retry["error"]
    assert [(trigger["rank"], trigger["attempt"]) for trigger in state["triggers"]] == [(1, 1), (1, 2)]
    assert all(column["status"] == "finished" for column in state["ranks"])
    assert "training at 32" in [line["text"] for line in state["ranks"][0]["lines"]]
    page = render_html(state)
    assert "64 &rarr; 32" in page and "all_gather_into_tensor" in page
    plain = render_text(state)
    assert "  - Process 1: [2] float32 at " in plain
    assert "out of memory on rank 1 at batch size 64 -> retried at 32" in plain


def test_a_failed_run_shows_the_root_cause_traceback_first():
    with pytest.raises(RankFailedError) as caught:
        launch(fails_on_rank_1)
    state = last_run().panel_state
    failure = state["failure"]
    assert state["status"] == "failed" and failure["kind"] == "failure"
    assert failure["rank"] == 1 and failure["type"] == "ValueError"
    assert "raise ValueError(\"bad value on rank 1\")" in failure["traceback"]
    assert failure["message"] == str(caught.value)
    assert [column["status"] for column in state["ranks"]] == ["stopped", "failed"]
    plain = render_text(state).splitlines()
    assert plain[2] == "root cause (rank 1):" and plain[3].startswith("Traceback")
    page = render_html(state)
    assert page.index("bad value on rank 1") < page.index("[rank 1] failed: ValueError")


def test_a_hang_marks_the_waiting_rank_stuck_and_carries_its_stack():
    with pytest.raises(LaunchTimeoutError):
        launch(leaves_early)
    state = last_run().panel_state
    assert state["status"] == "hung" and state["failure"]["kind"] == "hang"
    assert state["ranks"][0]["status"] == "stuck" and state["ranks"][1]["status"] == "finished"
    assert "leaves_early" in state["failure"]["stacks"]["0"]


def test_display_argument_is_checked_before_anything_starts():
    with pytest.raises(LaunchArgumentError, match=r"display='html' is not one of 'auto', 'panel', 'text'"):
        notebook_launcher(chatty, args=(1,), num_processes=2, display="html")


class _FakeHandle:
    def __init__(self):
        self.bundles = []

    def update(self, bundle, raw):
        self.bundles.append(bundle)


def test_updates_are_throttled_but_the_last_state_is_always_sent(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    state = RunState("id", "/tmp/run", "cpu", "gloo", "fork", 2, 2, [0, 1])
    panel = PanelDisplay(state)
    handle = _FakeHandle()
    monkeypatch.setattr(InteractiveShell, "initialized", classmethod(lambda cls: True))
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda bundle, raw, display_id: handle.bundles.append(bundle)
                        or handle)
    from notebook_launcher.events import STREAM, Event

    for seq in range(1, 1001):  # a thousand lines in a burst: a handful of updates, not a thousand
        panel.show(Event(rank=seq % 2, seq=seq, time=time.monotonic(), kind=STREAM,
                         data={"stream": "stdout", "text": f"line {seq}"}))
    assert 1 <= len(handle.bundles) <= 3
    final = panel.finish("finished", result_type="int")
    assert handle.bundles[-1][MIME_TYPE] == final and final["ranks"][1]["lines"][-1]["text"] == "line 999"
    assert set(handle.bundles[-1]) == {MIME_TYPE, "text/html", "text/plain"}
    assert html.escape("line 1000") in handle.bundles[-1]["text/html"]


def test_long_lines_with_bars_are_cheap_to_fold_and_crlf_split_across_reads_keeps_its_line():
    from notebook_launcher.decoding import LineSplitter
    from notebook_launcher.events import STREAM, Event

    state = RunState("id", "/tmp/run", "cpu", "gloo", "fork", 1, 1, [0])
    vocabulary = str({f"<|token{i}|>": i for i in range(20_000)})  # 400 KB with many "|": no regex blowup
    state.observe(Event(rank=0, seq=1, time=time.monotonic(), kind=STREAM, data={"stream": "stdout",
                                                                                 "text": vocabulary}))
    assert state.ranks[0].lines[-1]["text"] == vocabulary[:2000] and state.ranks[0].progress is None

    splitter = LineSplitter()
    assert splitter.feed(b"hello world\r") == [] and splitter.redraw() is None
    assert splitter.feed(b"\nnext\n") == ["hello world", "next"]


def test_a_large_state_is_sent_less_often(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    import IPython.display
    from notebook_launcher.display import panel as panel_module
    from notebook_launcher.events import STREAM, Event

    monkeypatch.setattr(InteractiveShell, "initialized", classmethod(lambda cls: True))
    handle = _FakeHandle()
    monkeypatch.setattr(IPython.display, "display", lambda bundle, raw, display_id: handle.bundles.append(bundle)
                        or handle)
    state = RunState("id", "/tmp/run", "cpu", "gloo", "fork", 8, 8, list(range(8)))
    panel = PanelDisplay(state)
    clock = [1000.0]
    monkeypatch.setattr(panel_module.time, "monotonic", lambda: clock[0])
    for seq in range(1, 8 * 200 + 1):  # eight full columns of long lines: a state of about 3 MB
        panel.show(Event(rank=seq % 8, seq=seq, time=clock[0], kind=STREAM, data={"stream": "stdout",
                                                                                  "text": "x" * 1000}))
    clock[0] += 1.0
    panel.show(Event(rank=0, seq=9_999, time=clock[0], kind=STREAM, data={"stream": "stdout", "text": "z"}))
    sent = len(handle.bundles)
    size = len(json.dumps(handle.bundles[-1]))  # the full state went out once
    for step in range(40):  # ten seconds of lines at the usual pace
        clock[0] += 0.25
        panel.show(Event(rank=0, seq=10_000 + step, time=clock[0], kind=STREAM, data={"stream": "stdout",
                                                                                      "text": "y" * 1000}))
    updates_in_ten_seconds = len(handle.bundles) - sent
    assert size > 2_000_000
    assert 1 <= updates_in_ten_seconds <= 10 * panel_module.MAX_BYTES_PER_S / size + 1  # not 40
