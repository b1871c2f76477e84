"""How each kind of event reads as text (display/describe.py), and that every display says it the same way.

The formats are those users see in a cell (README, test_ops, test_memory, test_failures) and in the inspector
(test_inspector); the events are shaped as the workers and the kernel make them (events.py).
"""

from __future__ import annotations

import pytest

from notebook_launcher import inspect_run
from notebook_launcher.display.describe import Description, describe
from notebook_launcher.display.fallback import render_text
from notebook_launcher.display.state import RunState
from notebook_launcher.display.text import TextDisplay
from notebook_launcher.schema.events import (
    BATCH_SIZE,
    EXIT,
    FAILURE,
    LAUNCHER,
    LOG,
    OOM_RETRY,
    OUTPUT,
    PROGRESS,
    RESULT,
    SHAPE_MISMATCH,
    STATUS,
    STREAM,
    TRIGGER,
    Event,
)
from notebook_launcher.schema.runlog import RunLog

TRACEBACK = ('Traceback (most recent call last):\n  File "train.py", line 3, in train\n'
             '    raise ValueError("bad value <here>")\nValueError: bad value <here>\nsecond line\n')
RECORD = {"level": "WARNING", "levelno": 30, "logger": "train", "message": "loss is nan", "file": "t.py", "line": 1,
          "function": "f", "created": 0.0, "exc_text": None, "stack": None, "in_order": None}
OOM = {"key": "inner", "ranks": [1], "batch_size": 128, "new_batch_size": 64,
       "error": "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                "memory", "memory": {}}
MISMATCH = ("Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid.\n\n"
            "Operation: `notebook_launcher.ops.broadcast`\nInput shapes:\n  - Process 0: [1, 5]\n"
            "  - Process 1: [1, 2, 5]")

# kind, data -> (row kind, row text, what the text display prints after the rank prefix)
CASES = [
    (STREAM, {"stream": "stdout", "text": "step 0 loss 0.412"}, "stdout", "step 0 loss 0.412",
     ["step 0 loss 0.412"]),
    (STREAM, {"stream": "stderr", "text": "a warning"}, "stderr", "a warning", ["a warning"]),
    (LOG, RECORD, LOG, "train: loss is nan", ["WARNING train: loss is nan"]),
    (FAILURE, {"type": "ValueError", "message": "bad value <here>\nsecond line", "traceback": TRACEBACK},
     FAILURE, "ValueError: bad value <here>", ["failed: ValueError: bad value <here>"]),
    (EXIT, {"exit_code": -9, "signal": 9, "signal_name": "SIGKILL", "stopped_by_launcher": False}, EXIT,
     "killed by SIGKILL", ["killed by SIGKILL"]),
    (EXIT, {"exit_code": -15, "signal": 15, "signal_name": "SIGTERM", "stopped_by_launcher": True}, EXIT,
     "killed by SIGTERM (stopped by the launcher)", []),
    (EXIT, {"exit_code": 0, "signal": None, "signal_name": None, "stopped_by_launcher": False}, EXIT,
     "exit code 0", []),
    (STATUS, {"state": "starting", "pid": 4242, "local_rank": 1}, STATUS, "starting (pid 4242, local rank 1)", []),
    (RESULT, {"type": "dict", "bytes": 120}, RESULT, "returned a dict (120 bytes)", []),
    (LAUNCHER, {"text": "restarting all ranks (try 2 of 3)"}, LAUNCHER, "restarting all ranks (try 2 of 3)",
     ["notebook_launcher: restarting all ranks (try 2 of 3)"]),
    (PROGRESS, {"step": 3, "total": 100000, "metrics": {"loss": 0.25, "lr": 1e-3}}, PROGRESS,
     "step 3/100000  loss=0.25  lr=0.001", []),
    (SHAPE_MISMATCH, {"operation": "notebook_launcher.ops.broadcast", "message": MISMATCH}, SHAPE_MISMATCH,
     "Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid.", []),
    (TRIGGER, {"call_site": "train.py:12 in train"}, TRIGGER, "set_trigger() at train.py:12 in train",
     ["set_trigger() at train.py:12 in train: the next check_trigger() returns True on every rank"]),
    (BATCH_SIZE, {"key": "inner", "batch_size": 64}, BATCH_SIZE, "inner: trying batch size 64", []),
    (OOM_RETRY, OOM, OOM_RETRY,
     "rank 1 ran out of memory at batch size 128 (RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. "
     "DefaultCPUAllocator: can't allocate memory); restarting all ranks at batch size 64",
     ["notebook_launcher: rank 1 ran out of memory at batch size 128 (RuntimeError: [enforce fail at "
      "alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory); restarting all ranks at batch "
      "size 64"]),
]


@pytest.mark.parametrize("kind,data,row_kind,row_text,printed", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_kind_reads_as_users_see_it(kind, data, row_kind, row_text, printed, capsys):
    said = describe(kind, data, rank=1)
    assert (said.kind, said.text) == (row_kind, row_text)
    display = TextDisplay("[rank ${rank}] ")
    display.show(Event(1, 0, 0.0, kind, data))
    out = capsys.readouterr()
    prefix = "" if kind in (LAUNCHER, OOM_RETRY) else "[rank 1] "
    expected = "".join(f"{prefix}{line}\n" for line in printed)
    assert out.out + out.err == expected
    if printed:  # failures, kills and stderr lines go to stderr; everything else to stdout
        assert (out.err if row_kind in ("stderr", FAILURE, EXIT) else out.out) == expected


def test_a_log_record_carries_its_level_and_its_exception_below():
    record = {**RECORD, "level": "ERROR", "levelno": 40, "message": "step failed",
              "exc_text": "Traceback (most recent call last):\nZeroDivisionError: division by zero"}
    said = describe(LOG, record)
    assert (said.level, said.levelno, said.text) == ("ERROR", 40, "train: step failed")
    assert said.detail == "Traceback (most recent call last):\nZeroDivisionError: division by zero"
    assert said.said == ("ERROR train: step failed", "Traceback (most recent call last):",
                         "ZeroDivisionError: division by zero")
    assert describe(LOG, {"level": "INFO", "logger": "x", "message": "m"}).levelno == 20  # from the name
    assert describe(LOG, {"in_order": 3, "skipped": True}) is None  # a placeholder says nothing


def test_a_failure_folds_its_traceback():
    said = describe(FAILURE, {"type": "ValueError", "message": "bad value <here>\nsecond line",
                              "traceback": TRACEBACK})
    assert said.detail == TRACEBACK
    untraced = describe(FAILURE, {"type": "TruncatedEvent", "message": "rank 1 died mid-frame\n(42 bytes)"})
    assert untraced.detail == "rank 1 died mid-frame\n(42 bytes)"  # a message of several lines, whole


def test_an_out_of_memory_retry_without_ranks_names_the_event_rank():
    assert describe(OOM_RETRY, {**OOM, "ranks": None}, rank=3).text.startswith("rank 3 ran out of memory")


def test_output_and_unknown_kinds_have_rows_and_are_not_printed(capsys):
    output = describe(OUTPUT, {"stream": "stderr", "text": "partial"})
    assert (output.kind, output.text, output.said) == ("stderr", "partial", ())  # its lines come as stream events
    unknown = describe("node_error", {"type": "OSError", "worker_seq": 7})
    assert unknown == Description("node_error", "", 0, '{"type": "OSError"}', "", ())
    display = TextDisplay("[rank ${rank}] ")
    display.show(Event(0, 0, 0.0, OUTPUT, {"stream": "stdout", "text": "partial"}))
    display.show(Event(0, 0, 0.0, "node_error", {"type": "OSError"}))
    assert capsys.readouterr().out == ""


def test_the_text_display_the_panel_and_the_inspector_say_the_same(runs_dir):
    """One run log, read by all three: the same log line, failure line and kill line."""
    events = [Event(1, 0, 10.0, LOG, RECORD),
              Event(1, 1, 10.5, TRIGGER, {"call_site": "train.py:12 in train"}),
              Event(1, 2, 11.0, FAILURE, {"type": "ValueError", "message": "bad value <here>\nsecond line",
                                         "traceback": TRACEBACK}),
              Event(0, 0, 11.5, EXIT, {"exit_code": -9, "signal_name": "SIGKILL"})]
    state = RunState("r", "/tmp/r", "cpu", "gloo", "fork", 2, 2, [0, 1])
    log = RunLog()
    for event in events:
        state.observe(event)
        log.write(event)
    log.close()
    plain = render_text(state.to_json()).splitlines()
    for line in ("[rank 1] WARNING train: loss is nan", "[rank 1] failed: ValueError: bad value <here>",
                 "[rank 0] killed by SIGKILL", "rank 1 called set_trigger() at train.py:12 in train"):
        assert line in plain
    inspector = inspect_run(log.path)
    try:
        rows = [(row.rank, row.level or row.kind, row.text) for row in inspector.rows]
    finally:
        inspector.close()
    assert rows == [(1, "WARNING", "train: loss is nan"), (1, TRIGGER, "set_trigger() at train.py:12 in train"),
                    (1, FAILURE, "ValueError: bad value <here>"), (0, EXIT, "killed by SIGKILL")]
