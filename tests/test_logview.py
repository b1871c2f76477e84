"""The inspector's model (display/logview.py) on real run logs, without widgets: filters, search, pages, reload.

The widget on top (test_inspector.py) shows what this gives; here the same questions are asked of the model
alone, as a script or another frontend would.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from notebook_launcher import RunNotFoundError
from notebook_launcher.display.logview import LEVEL_HELP, LogView
from notebook_launcher.runs import resolve_run
from notebook_launcher.schema.events import EXIT, FAILURE, LOG, PROGRESS, STATUS, STREAM, Event
from notebook_launcher.schema.runlog import RunLog

TRACEBACK = 'Traceback (most recent call last):\n  File "t.py", line 2, in f\nValueError: no <good>\n'


def record(level: str, levelno: int, message: str) -> dict:
    return {"level": level, "levelno": levelno, "logger": "train", "message": message, "exc_text": None,
            "stack": None, "in_order": None}


def write_run(log: RunLog, ranks: int = 2, steps: int = 10) -> None:
    """Each rank starts, prints a line and logs at INFO per step, warns once; rank 1 fails at the end."""
    seq, when = 0, 100.0
    for rank in range(ranks):
        log.write(Event(rank, seq, when, STATUS, {"state": "running", "pid": 1000 + rank}))
    for step in range(steps):
        for rank in range(ranks):
            seq, when = seq + 1, when + 0.01
            log.write(Event(rank, seq, when, STREAM, {"stream": "stdout", "text": f"rank {rank} step {step}"}))
            log.write(Event(rank, seq, when, LOG, record("INFO", 20, f"loss {1 / (step + 1):.3f} on {rank}")))
            log.write(Event(rank, seq, when, PROGRESS, {"step": step, "total": steps, "metrics": {"loss": 0.5}}))
    for rank in range(ranks):
        log.write(Event(rank, seq, when + 1, LOG, record("WARNING", 30, f"Slow data loader on rank {rank}")))
    log.write(Event(1, seq, when + 2, FAILURE, {"type": "ValueError", "message": "no <good>",
                                                "traceback": TRACEBACK}))
    log.write(Event(1, seq, when + 3, EXIT, {"exit_code": 1, "signal_name": None}))
    log.write(Event(0, seq, when + 3, EXIT, {"exit_code": -15, "signal_name": "SIGTERM",
                                             "stopped_by_launcher": True}))


@pytest.fixture
def view(runs_dir):
    log = RunLog()
    write_run(log)
    log.write_summary({"run_id": log.run_id, "status": "failed", "device": "cpu", "backend": "gloo",
                       "start_method": "fork", "num_processes": 2, "world_size": 2, "duration_s": 3.5,
                       "root_cause": {"rank": 1, "type": "ValueError", "message": "no <good>"}})
    log.close()
    return LogView(*resolve_run(log.run_id), page_size=10)


def texts(rows):
    return [row.text for row in rows]


def test_every_event_is_a_row_in_log_order(view):
    assert len(view.all_rows) == view.reader.events == 2 + 10 * 2 * 3 + 2 + 3
    assert [row.line for row in view.all_rows] == list(range(1, len(view.all_rows) + 1))
    assert view.all_rows[0].time == 0.0 and view.all_rows[0].text == "running (pid 1000)"
    assert view.rank_options == [0, 1]
    assert view.kind_options == ["stdout", LOG, FAILURE, EXIT, STATUS, PROGRESS]  # in the filter's order
    assert view.event(3) == {"rank": 0, "seq": 1, "time": 100.01, "kind": STREAM,
                             "data": {"stream": "stdout", "text": "rank 0 step 0"}}


def test_rank_kind_and_level_filters(view):
    view.filter(rank=1, kind="stdout")
    assert texts(view.rows) == [f"rank 1 step {step}" for step in range(10)]
    view.filter(rank="all", kind=[LOG, FAILURE], level="INFO")  # a level: log records only, at it and above
    assert {row.kind for row in view.rows} == {LOG} and len(view.rows) == 2 * 10 + 2
    view.filter(kind="all", level="WARNING")  # output lines, progress, status and exits are not log records
    assert texts(view.rows) == ["train: Slow data loader on rank 0", "train: Slow data loader on rank 1"]
    view.filter(level="errors and warnings")  # the warnings, the failure and the exit it caused
    assert texts(view.rows) == ["train: Slow data loader on rank 0", "train: Slow data loader on rank 1",
                                "ValueError: no <good>", "exit code 1"]  # not rank 0 stopped by the launcher
    assert view.rows[2].detail == TRACEBACK
    view.filter(level="all", kind="all")
    assert len(view.rows) == len(view.all_rows)
    assert "output lines (print, stderr) and progress rows are hidden" in LEVEL_HELP
    with pytest.raises(ValueError, match=r"rank=\[7\] is not in this run; it has \['all', 0, 1\]"):
        view.filter(rank=7)
    with pytest.raises(ValueError, match="expected DEBUG, INFO, WARNING, ERROR, CRITICAL, a number, 'errors and "):
        view.filter(level="LOUD")


def test_search_plain_regex_and_invalid(view):
    view.filter(search="SLOW DATA")
    assert texts(view.rows) == ["train: Slow data loader on rank 0", "train: Slow data loader on rank 1"]
    assert view.highlighter().pattern == "SLOW\\ DATA"
    view.filter(search=r"step [89]$", regex=True, rank=0)
    assert texts(view.rows) == ["rank 0 step 8", "rank 0 step 9"]
    view.filter(search="ValueError: no", rank="all")  # the traceback is searched too
    assert [row.kind for row in view.rows] == [FAILURE]
    view.filter(search="step (")
    assert view.rows == [] and view.error.startswith("invalid regular expression") and view.highlighter() is None
    view.filter(regex=False)
    assert view.error == "" and view.rows == []


def test_pages_are_clamped_and_go_to_line_finds_the_next_kept_row(view):
    view.filter(kind="stdout")  # 20 rows, 10 a page
    assert (view.page, view.page_count) == (1, 2) and len(view.page_rows) == 10
    view.page = 99
    assert view.page == 2 and texts(view.page_rows)[-1] == "rank 1 step 9"
    view.page = -3
    assert view.page == 1
    view.page_size = 3  # the first row shown stays on the page
    assert view.page_count == 7 and view.page == 1
    target = view.go_to_line(view.rows[10].number - 1)  # a log row before it: the next stdout row is found
    assert target == view.rows[10] and view.target_line == target.number and view.page == 4
    assert view.page_text.splitlines()[1] == f"{target.number:>7}       0.110  [rank 0]  stdout    rank 0 step 5"
    assert view.go_to_line(10**6) is None and view.target_line is None and view.page == 4
    view.filter(kind=LOG)  # filtering again starts at the first page
    assert view.page == 1


def test_header_says_what_the_run_was(view):
    first, cause = view.header_text.split("\n")
    assert first == (f"run {view.run_id}  ·  failed  ·  2 ranks  ·  cpu/gloo (fork)  ·  3.50 s  ·  "
                     f"{len(view.all_rows)} events")
    assert cause == "root cause: rank 1 ValueError: no <good>"


def test_reload_follows_a_run_that_is_still_writing(runs_dir, monkeypatch):
    monkeypatch.setattr(RunLog, "_FLUSH_EVERY_S", -1)  # every write reaches the file at once
    log = RunLog()
    for index in range(6):
        log.write(Event(index % 2, index, 10.0 + index, STREAM, {"stream": "stdout", "text": f"early {index}"}))
    view = LogView(log.path, page_size=4)
    assert view.run is None and "no summary yet" in view.header_text and view.rank_options == [0, 1]
    view.page = 2
    log.write(Event(2, 6, 16.5, STREAM, {"stream": "stderr", "text": "a third rank"}))
    log.write(Event(0, 7, 17.0, LOG, {"level": "INFO", "levelno": 20, "logger": "x", "message": "late"}))
    assert view.reload() == 2
    assert texts(view.all_rows)[-2:] == ["a third rank", "x: late"] and view.page == view.page_count == 2
    assert view.rank_options == [0, 1, 2] and "stderr" in view.kind_options
    view.filter(kind="stderr")
    assert texts(view.rows) == ["a third rank"]
    log.close()


def test_unknown_run(runs_dir):
    with pytest.raises(RunNotFoundError, match="There is no run log under"):
        resolve_run("20000101-000000-1-abcdef")


@pytest.mark.processes
def test_the_model_does_not_import_ipywidgets():
    """Scripts and workers read run logs without paying for the widget library."""
    code = ("import sys, notebook_launcher.display.logview, notebook_launcher.display.logreader;"
            "print('ipywidgets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_stderr_lines_that_read_as_errors_or_warnings_are_in_errors_and_warnings(runs_dir):
    log = RunLog()
    lines = ["Epoch 1:  40%|####      | 4/10 [00:01<00:01]", "Traceback (most recent call last):",
             "  File \"t.py\", line 2, in f", "ValueError: bad", "t.py:3: UserWarning: the lr is high",
             "[W1130 21:00:00.000000 socket.cpp:752] cannot reach 127.0.0.2", "loading 10 shards"]
    for index, text in enumerate(lines):
        log.write(Event(0, index, 1.0 + index, STREAM, {"stream": "stderr", "text": text}))
    log.write(Event(0, 9, 9.0, STREAM, {"stream": "stdout", "text": "no error at all: stdout is not looked at"}))
    log.close()
    view = LogView(log.path).filter(level="errors and warnings")
    assert texts(view.rows) == ["Traceback (most recent call last):", "ValueError: bad",
                                "t.py:3: UserWarning: the lr is high",
                                "[W1130 21:00:00.000000 socket.cpp:752] cannot reach 127.0.0.2"]
    assert view.filter(level="WARNING").rows == []  # none is a log record


def test_rows_are_numbered_in_the_run_whatever_the_log_holds_between_them(runs_dir, monkeypatch):
    """Numbers count the rows a user sees (1, 2, 3 ...), not the lines of events.jsonl: a line that is not a
    record, a log placeholder or a progress bar's earlier state take no number."""
    monkeypatch.setattr(RunLog, "_FLUSH_EVERY_S", -1)  # every write reaches the file at once
    log = RunLog()
    log.write(Event(0, 0, 1.0, STREAM, {"stream": "stdout", "text": "first"}))
    log._events.write("not a record\n")
    log.write(Event(0, 1, 1.1, LOG, {"in_order": 1}))  # a placeholder: nothing to read
    for step in range(3):
        log.write(Event(0, 2 + step, 1.2, STREAM, {"stream": "stderr", "text": f"bar {step}/3", "redraw": True}))
    log.write(Event(0, 5, 1.3, LOG, record("WARNING", 30, "second")))
    log.close()
    view = LogView(log.path)
    assert [(row.number, row.line, row.text) for row in view.all_rows] == [
        (1, 1, "first"), (2, 6, "bar 2/3"), (3, 7, "train: second")]
    view.filter(level="WARNING")
    assert [row.number for row in view.rows] == [3] and view.page_text.split()[0] == "3"
    view.filter(level="all")
    assert view.go_to_line(2).text == "bar 2/3" and view.row(3).text == "train: second" and view.row(4) is None
    assert view.event(view.row(3).line)["data"]["message"] == "second"
