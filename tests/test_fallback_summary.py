"""The run's summary (display/summary.py) and the fallback that shows it first (display/fallback.py), over the
states of real launches (real processes, gloo): a steady run, a failure, an out-of-memory retry, a timed-out
hang, and a hang while it is live (the run log's events up to the notice, played into a RunState)."""

from __future__ import annotations

import re
import time

import pytest

from notebook_launcher import find_executable_batch_size, get_logger, last_run, notebook_launcher, report
from notebook_launcher.display.delta import DeltaTracker
from notebook_launcher.display.fallback import render_html, render_text
from notebook_launcher.display.replay import read_events
from notebook_launcher.display.state import RunState
from notebook_launcher.schema.events import HANG_NOTICE, STREAM, Event


def steady(steps):
    import torch.distributed as dist

    logger = get_logger("train", log_level="INFO")
    for step in range(1, steps + 1):
        if step == 3:
            logger.warning("lr looks high", main_process_only=False)
        print(f"step {step} on rank {dist.get_rank()}", flush=True)
        report(step=step, total=steps, loss=1.0 / step)
        time.sleep(0.02)
    dist.barrier()


def many_lines(count):
    logger = get_logger("train", log_level="INFO")
    for number in range(count):
        if number == 5:
            logger.warning("an early warning", main_process_only=False)
        print(f"line {number}", flush=True)


def failing():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad batch at step 3")
    dist.barrier()


def out_of_memory_once():
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()

    @find_executable_batch_size(starting_batch_size=64)
    def fit(batch_size):
        if rank == 1 and batch_size > 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        print(f"fit at {batch_size}", flush=True)

    fit()


def skips_an_all_reduce():
    import torch
    import torch.distributed as dist

    for _ in range(2):
        dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins it
    dist.barrier()


def _state(function, *args, **options) -> dict:
    try:
        notebook_launcher(function, args=args, num_processes=2, display="panel", **options)
    except Exception:  # noqa: BLE001 - the failed runs: their state is what is checked
        pass
    return last_run().panel_state


def _pres_are_monospace(page: str) -> None:
    pres = re.findall(r"<pre[^>]*>", page)
    assert pres and all("monospace" in pre and "font-family:" in pre for pre in pres), pres


@pytest.mark.processes
def test_a_steady_run_has_a_row_per_rank_with_step_speed_and_warnings_and_a_balance_line(runs_dir):
    state = _state(steady, 20)
    summary = state["summary"]
    assert summary["verdict"] == "finished" and summary["title"].startswith("Finished in ")
    assert summary["inspect"] == f'inspect_run("{state["run_id"]}")'
    assert summary["balance"] and "straggler" in summary["balance"]
    for rank in state["ranks"]:
        row = rank["summary"]
        assert row["step"] == "20/20" and row["speed"].endswith(" s/step") and row["warnings"] == 1
        assert row["last"] == f"step 20 on rank {rank['rank']}" and "errors" not in row
    plain = render_text(state).splitlines()
    assert plain[0] == summary["title"]  # the verdict first, the rows next
    header = plain.index(next(line for line in plain if line.startswith("rank  status")))
    assert [line.split()[:3] for line in plain[header + 1:header + 3]] == [["0", "finished", "20/20"],
                                                                         ["1", "finished", "20/20"]]
    assert not any(line.startswith("status by rank") for line in plain)
    page = render_html(state)
    assert page.index('class="nl-verdict"') < page.index("rank  status") < page.index("[rank 0] step 1 on rank 0")
    assert page.count("<details") == 2 and page.count("inspect_run(") == 1
    _pres_are_monospace(page)


@pytest.mark.processes
def test_a_failure_is_the_verdict_and_its_traceback_is_told_once(runs_dir):
    state = _state(failing)
    assert state["summary"]["title"] == "Failed: rank 1 raised ValueError: bad batch at step 3"
    plain, page = render_text(state), render_html(state)
    assert plain.splitlines()[0] == state["summary"]["title"]
    assert plain.count('raise ValueError("bad batch at step 3")') == 1
    assert page.count("raise ValueError(&quot;bad batch at step 3&quot;)") == 1
    assert page.index("Failed: rank 1 raised") < page.index("Traceback") < page.index("rank  status")
    _pres_are_monospace(page)


@pytest.mark.processes
def test_an_out_of_memory_retry_is_the_verdict_told_once_in_amber_not_as_a_failure(runs_dir):
    state = _state(out_of_memory_once)
    summary = state["summary"]
    assert summary["verdict"] == "oom"
    assert summary["title"] == "Retried after out of memory at batch size 64: finished at batch size 32"
    plain, page = render_text(state), render_html(state)
    told = "out of memory on rank 1 at batch size 64: retried at 32 (OutOfMemoryError: CUDA out of memory."
    assert plain.count(told) == 1 and page.count(told) == 1
    retry_line = re.search(r'<span style="color:([^"]+)">\[rank 1\] out of memory at batch size 64: retried at '
                           r'batch size 32', page)
    assert retry_line and retry_line[1] == "#b06000"  # amber, as a retry
    assert "#d93025" not in page  # nothing red: nothing failed


@pytest.mark.processes
def test_a_timed_out_hang_says_where_each_rank_waits(runs_dir):
    state = _state(skips_an_all_reduce, hang_warning=2, timeout=6)
    summary = state["summary"]
    assert summary["verdict"] == "timed out"
    assert re.fullmatch(r"Timed out after [\d.]+ s: the ranks wait in different collectives \(rank 0 in "
                        r"all_reduce #\d+, rank 1 in barrier #\d+\)", summary["title"]), summary["title"]
    assert [line.split(":")[0] for line in summary["detail"]] == ["rank 0", "rank 1"]
    assert "in all_reduce" in summary["detail"][0] and "in barrier" in summary["detail"][1]
    page = render_html(state)
    assert page.index("Timed out after") < page.index("rank 0: Python stack") < page.index("rank  status")
    assert [rank["status"] for rank in state["ranks"]] == ["stuck", "stuck"]


@pytest.mark.processes
def test_a_live_hangs_seconds_move_with_the_clock(runs_dir):
    """The events of a real hang up to its notice, played into a RunState: the verdict's seconds and each rank's
    wait move on with the clock while nothing else happens."""
    final = _state(skips_an_all_reduce, hang_warning=2, timeout=6)
    events = read_events(final["run_dir"])
    notice = next(index for index, event in enumerate(events)
                  if event.kind == HANG_NOTICE and event.data.get("state") == "open")
    state = RunState("live", final["run_dir"], "cpu", "gloo", "fork", 2, 2, [0, 1])
    for event in events[:notice + 1]:
        state.observe(event)
    first = state.to_json()["summary"]
    state._started -= 5.0  # five more quiet seconds, as the clock would have them
    later = state.to_json()["summary"]
    seconds = [int(re.match(r"Possible hang: (\d+) s without progress", s["title"])[1]) for s in (first, later)]
    assert first["verdict"] == later["verdict"] == "hang" and seconds[1] - seconds[0] in (4, 5, 6)
    assert "rank 0 in all_reduce" in later["title"] and any("timeout=6 s" in line for line in later["detail"])
    waits = [int(re.search(r"waiting (\d+) s", line)[1]) for line in later["detail"] if line.startswith("rank")]
    assert waits and all(wait >= seconds[1] - 1 for wait in waits)


@pytest.mark.processes
def test_an_early_warning_stays_in_the_fallback_after_its_line_left_the_panels_window(runs_dir):
    state = _state(many_lines, 300)
    for rank in state["ranks"]:
        assert rank["lines_dropped"] > 0 and rank["summary"]["warnings"] == 1
        assert "an early warning" not in [line["text"] for line in rank["lines"]]
    assert [(line["rank"], line["text"]) for line in sorted(state["summary"]["early"], key=lambda x: x["rank"])] \
        == [(0, "an early warning"), (1, "an early warning")]
    plain = render_text(state)
    assert "[rank 0] WARNING an early warning" in plain and plain.count("earlier lines are in the run log") == 1
    assert f'inspect_run("{state["run_id"]}")' in plain


def test_a_delta_resends_only_the_row_of_the_rank_that_changed():
    state = RunState("r", "/tmp/r", "cpu", "gloo", "fork", 4, 4, range(4))
    tracker = DeltaTracker(state)
    tracker.reset()
    state.observe(Event(2, 0, time.time(), STREAM, {"stream": "stdout", "text": "hello"}))
    delta = tracker.delta()
    assert [change["rank"] for change in delta["ranks"]] == [2]
    assert delta["ranks"][0]["summary"] == {"last": "hello"}
    assert "summary" not in delta["set"]  # the run's part did not change
