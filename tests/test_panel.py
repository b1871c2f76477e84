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

from notebook_launcher import (
    LaunchArgumentError,
    LaunchTimeoutError,
    RankFailedError,
    find_executable_batch_size,
    last_run,
    notebook_launcher,
    report,
    set_trigger,
)
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
    dist.barrier()  # rank 0 sends the mismatch as it raises: rank 1's failure below must not stop it first

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
@pytest.mark.processes
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
    assert plain.splitlines()[0] == "Finished in " + plain.splitlines()[0].split(" in ", 1)[1]  # the verdict first
    assert [line.split()[:2] for line in plain.splitlines()[3:5]] == [["0", "finished"], ["1", "finished"]]
    assert plain in capsys.readouterr().out  # display="panel" outside Jupyter prints the final state once


@pytest.mark.processes
def test_each_rank_keeps_its_newest_lines_and_says_how_many_are_only_in_the_run_log():
    launch(chatty, 450)
    state = last_run().panel_state
    for rank in (0, 1):
        column = state["ranks"][rank]
        assert len(column["lines"]) == 200
        assert column["lines_total"] == 452 and column["lines_dropped"] == 252
        assert column["lines"][-3]["text"] == f"rank {rank} line 449"
    plain = render_text(state)
    assert plain.count("earlier lines are in the run log") == 1  # told once, with how to open it
    assert f'(252 of rank 0, 252 of rank 1 earlier lines are in the run log: inspect_run("{state["run_id"]}")' in plain
    assert len(json.dumps(state)) < 100_000  # bounded, however much the ranks print


@pytest.mark.processes
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


@pytest.mark.processes
def test_a_tqdm_bar_in_a_worker_becomes_its_progress_not_a_flood_of_lines():
    launch(tqdm_loop)
    state = last_run().panel_state
    for column in state["ranks"]:
        assert column["progress"]["step"] == 20 and column["progress"]["total"] == 20
        assert column["progress"]["label"] == "epoch"
        bars = [line["text"] for line in column["lines"] if "|" in line["text"]]
        assert len(bars) == 1 and bars[0].startswith("epoch: 100%|")  # only the bar's final state is a line
    assert all("\r" not in line for line in last_run().output())


@pytest.mark.processes
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
    assert "at batch size 64: retried at 32" in page and "all_gather_into_tensor" in page
    plain = render_text(state)
    assert "  - Process 1: [2] float32 at " in plain
    assert plain.count("out of memory on rank 1 at batch size 64: retried at 32") == 1  # told once


@pytest.mark.processes
def test_a_failed_run_shows_the_root_cause_traceback_first():
    with pytest.raises(RankFailedError) as caught:
        launch(fails_on_rank_1)
    state = last_run().panel_state
    failure = state["failure"]
    assert state["status"] == "failed" and failure["kind"] == "failure"
    assert failure["rank"] == 1 and failure["type"] == "ValueError"
    assert "raise ValueError(\"bad value on rank 1\")" in failure["traceback"]
    assert failure["verdict"] == "Rank 1 failed first: ValueError: bad value on rank 1"  # the card's title
    assert failure["traceback"] not in failure["message"]  # told once: the message keeps the other ranks
    assert failure["message"] in str(caught.value) and "rank 0:" in failure["message"]
    assert [column["status"] for column in state["ranks"]] == ["stopped", "failed"]
    plain = render_text(state).splitlines()
    assert plain[0] == "Failed: rank 1 raised ValueError: bad value on rank 1" and plain[2].startswith("Traceback")
    page = render_html(state)
    assert page.index("bad value on rank 1") < page.index("[rank 1] failed: ValueError")


@pytest.mark.processes
def test_a_hang_marks_the_waiting_rank_stuck_and_carries_its_stack():
    with pytest.raises(LaunchTimeoutError):
        launch(leaves_early)
    state = last_run().panel_state
    assert state["status"] == "hung" and state["failure"]["kind"] == "hang"
    assert state["ranks"][0]["status"] == "stuck" and state["ranks"][1]["status"] == "finished"
    assert "leaves_early" in state["failure"]["stacks"]["0"]


@pytest.mark.processes
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
    from notebook_launcher.schema.events import STREAM, Event

    for seq in range(1, 1001):  # a thousand lines in a burst: a handful of updates, not a thousand
        panel.show(Event(rank=seq % 2, seq=seq, time=time.monotonic(), kind=STREAM,
                         data={"stream": "stdout", "text": f"line {seq}"}))
    assert 1 <= len(handle.bundles) <= 3
    final = panel.finish("finished", result_type="int")
    assert handle.bundles[-1][MIME_TYPE] == final and final["ranks"][1]["lines"][-1]["text"] == "line 999"
    assert set(handle.bundles[-1]) == {MIME_TYPE, "text/html", "text/plain"}
    assert html.escape("line 1000") in handle.bundles[-1]["text/html"]


def test_long_lines_with_bars_are_cheap_to_fold_and_crlf_split_across_reads_keeps_its_line():
    from notebook_launcher.schema.decoding import LineSplitter
    from notebook_launcher.schema.events import STREAM, Event

    state = RunState("id", "/tmp/run", "cpu", "gloo", "fork", 1, 1, [0])
    vocabulary = str({f"<|token{i}|>": i for i in range(20_000)})  # 400 KB with many "|": no regex blowup
    state.observe(Event(rank=0, seq=1, time=time.monotonic(), kind=STREAM, data={"stream": "stdout",
                                                                                 "text": vocabulary}))
    assert state.ranks[0].lines[-1]["text"] == vocabulary[:2000] and state.ranks[0].progress is None

    splitter = LineSplitter()
    assert splitter.feed(b"hello world\r") == [] and splitter.redraw() is None
    assert splitter.feed(b"\nnext\n") == ["hello world", "next"]


def test_a_large_state_is_cut_to_the_saved_budget_so_it_still_goes_out_at_the_usual_pace(monkeypatch):
    import IPython.display
    from IPython.core.interactiveshell import InteractiveShell

    from notebook_launcher.display import panel as panel_module
    from notebook_launcher.display.budget import SAVED_BYTES, saved_size
    from notebook_launcher.schema.events import STREAM, Event

    monkeypatch.setattr(InteractiveShell, "initialized", classmethod(lambda cls: True))
    handle = _FakeHandle()
    monkeypatch.setattr(IPython.display, "display", lambda bundle, raw, display_id: handle.bundles.append(bundle)
                        or handle)
    state = RunState("id", "/tmp/run", "cpu", "gloo", "fork", 8, 8, list(range(8)))
    panel = PanelDisplay(state, channel=None)
    clock = [1000.0]
    monkeypatch.setattr(panel_module.time, "monotonic", lambda: clock[0])
    for seq in range(1, 8 * 200 + 1):  # eight full columns of long lines: a state of 1.7 MB, a bundle of 5
        panel.show(Event(rank=seq % 8, seq=seq, time=clock[0], kind=STREAM, data={"stream": "stdout",
                                                                                  "text": "x" * 1000}))
    clock[0] += 1.0
    panel.show(Event(rank=0, seq=9_999, time=clock[0], kind=STREAM, data={"stream": "stdout", "text": "z"}))
    sent = len(handle.bundles)
    for step in range(40):  # ten seconds of lines at the usual pace
        clock[0] += 0.25
        panel.show(Event(rank=0, seq=10_000 + step, time=clock[0], kind=STREAM, data={"stream": "stdout",
                                                                                      "text": "y" * 1000}))
    updates_in_ten_seconds = len(handle.bundles) - sent
    assert len(json.dumps(state.to_json())) > 1_500_000
    assert all(saved_size(bundle) <= SAVED_BYTES for bundle in handle.bundles)
    last = handle.bundles[-1][MIME_TYPE]
    assert last["ranks"][0]["lines"][-1]["text"] == "y" * 1000 and last["ranks"][0]["lines"][0]["text"] != "x" * 1000
    assert last["saved"]["lines_total"] == sum(rank["lines_total"] for rank in last["ranks"]) > 8 * 200
    size = len(json.dumps(last)) + len(handle.bundles[-1]["text/html"]) + len(handle.bundles[-1]["text/plain"])
    assert size < SAVED_BYTES  # so the byte cap allows several updates a second, not one every 6 s as uncut
    # each update as soon as the byte cap allows it, at the next line (lines come every 0.25 s)
    assert 10 / (size / panel_module.MAX_BYTES_PER_S + 0.25) - 1 <= updates_in_ten_seconds <= 41


# -- hang notices (events the kernel's watchdog makes, built here by hand) -------------------------------------------
def _hang_notice(seq: int, at: float, state: str, **data):
    from notebook_launcher.schema.events import HANG_NOTICE, Event

    return Event(rank=-1, seq=seq, time=at, kind=HANG_NOTICE, data={"state": state, **data})


def _open_notice(seq: int, at: float, stack: str = "rank 1's stack"):
    return _hang_notice(
        seq, at, "open", quiet_s=31.2, diverged=0,
        ranks={"0": {"state": "in_ddp", "text": "in DDP's gradient all_reduce (step 4) at train.py:31 in train"},
               "1": {"state": "waiting", "text": "waiting 31 s in barrier #1 at train.py:40 in train"},
               "2": {"state": "busy", "text": "busy 31 s in Python at train.py:12 in load"},
               "3": {"state": "finished", "text": "finished"}},
        stacks={"0": "File \"train.py\", line 31 in train", "1": stack},
        text="possible hang: no rank made progress for 31 s\n  rank 0: in DDP's gradient all_reduce (step 4) at "
             "train.py:31 in train\n  rank 1: waiting 31 s in barrier #1 at train.py:40 in train <b>")


def _hang_state():
    from notebook_launcher.schema.events import STATUS, Event

    state = RunState("id", "/tmp/run", "cpu", "gloo", "fork", 4, 4, [0, 1, 2, 3])
    start = state._started
    for rank in range(4):
        state.observe(Event(rank=rank, seq=1, time=start, kind=STATUS, data={"state": "running"}))
    state.observe(Event(rank=3, seq=2, time=start + 1, kind=STATUS, data={"state": "finished", "exit_code": 0}))
    return state, start


def test_an_open_hang_notice_is_a_live_card_and_badges_on_the_ranks_it_lists():
    state, start = _hang_state()
    state.observe(_open_notice(1, start + 40.0))
    payload = json.loads(json.dumps(state.to_json()))  # what the extension receives
    hang = payload["hang"]
    assert hang["live"] is True and hang["t"] == 40.0 and hang["quiet_s"] == 31.2 and hang["diverged"] == 0
    assert hang["ranks"]["1"] == {"state": "waiting", "text": "waiting 31 s in barrier #1 at train.py:40 in train"}
    assert hang["stacks"]["1"] == "rank 1's stack" and payload["hangs"] == []
    assert [r["status"] for r in payload["ranks"]] == ["in DDP", "waiting", "busy", "finished"]
    assert -1 not in state.ranks  # the launcher's notice is no rank column
    plain = render_text(payload)
    assert plain.startswith("Possible hang: 31 s without progress")  # the verdict first
    assert "  rank 1: waiting 31 s in barrier #1 at train.py:40 in train" in plain.splitlines()
    assert [line.split()[:3] for line in plain.splitlines()[7:11]] == [
        ["0", "in", "DDP"], ["1", "waiting", "0"], ["2", "busy", "0"], ["3", "finished", "0"]]
    page = render_html(payload)
    assert "Possible hang: 31 s without progress" in page and "<b>" not in page


def test_a_cleared_notice_stays_not_live_and_the_ranks_run_again_unless_they_ended():
    from notebook_launcher.schema.events import EXIT, Event

    state, start = _hang_state()
    state.observe(_open_notice(1, start + 40.0))
    state.observe(Event(rank=2, seq=3, time=start + 41, kind=EXIT, data={"exit_code": 1}))  # rank 2 died meanwhile
    state.observe(_hang_notice(2, start + 46.0, "cleared", quiet_s=6.0, text="progress resumed after 6 s"))
    payload = state.to_json()
    hang = payload["hang"]
    assert hang["live"] is False and hang["cleared_after"] == 6.0 and hang["cleared_t"] == 46.0
    assert hang["cleared_text"] == "progress resumed after 6 s" and hang["ranks"]["0"]["state"] == "in_ddp"
    assert [r["status"] for r in payload["ranks"]] == ["running", "running", "failed", "finished"]
    assert "possible hang at 40.0 s, 31 s without progress: cleared after 6 s" in render_text(payload).splitlines()
    assert "possible hang: no rank" not in render_text(payload)

    state.observe(_open_notice(3, start + 90.0, stack="x" * 50_000))  # the next one: the first goes to history
    payload = state.to_json()
    assert payload["hang"]["live"] is True and payload["hang"]["t"] == 90.0
    assert [r["status"] for r in payload["ranks"]] == ["in DDP", "waiting", "failed", "finished"]
    (earlier,) = payload["hangs"]
    assert earlier["t"] == 40.0 and earlier["cleared_after"] == 6.0 and earlier["stacks"] == {}
    assert earlier["stacks_dropped"] == 2
    cut = payload["hang"]["stacks"]["1"]
    assert len(cut) < 4100 and "more characters in the run log" in cut


def test_hang_notices_are_bounded_and_a_live_one_ends_with_the_run():
    state, start = _hang_state()
    for index in range(30):
        state.observe(_open_notice(2 * index, start + 40.0 + index * 10))
        state.observe(_hang_notice(2 * index + 1, start + 45.0 + index * 10, "cleared", quiet_s=5.0, text="resumed"))
    state.observe(_open_notice(100, start + 400.0))
    assert len(state.to_json()["hangs"]) == 10
    stacks = {str(rank): "s" for rank in range(40)}
    state.observe(_hang_notice(101, start + 401.0, "open", ranks={}, diverged=33, stacks=stacks, text="again"))
    kept = state.to_json()["hang"]["stacks"]
    assert len(kept) == 16 and "33" in kept and "0" in kept
    state.finish("hung", stuck_ranks=[1])
    payload = state.to_json()
    assert payload["hang"]["live"] is False and payload["hang"]["cleared_after"] is None
    assert [r["status"] for r in payload["ranks"]] == ["stuck", "stuck", "stuck", "finished"]
    plain = render_text(payload)
    assert "possible hang at 400.0 s" in plain and "not cleared before the run ended" in plain


def test_a_restart_ends_a_live_hang_notice():
    from notebook_launcher.schema.events import RESTART, Event

    state, start = _hang_state()
    state.observe(_open_notice(1, start + 40.0))
    state.observe(Event(rank=-1, seq=2, time=start + 50, kind=RESTART,
                        data={"attempt": 2, "reason": "failure", "text": "restarting"}))
    payload = state.to_json()
    assert payload["hang"]["live"] is False and payload["attempt"] == 2
    assert [r["status"] for r in payload["ranks"]] == ["starting"] * 4
