"""Plain lines travel through the kernel as runs (``RankDemux`` → run log, Run.events, failure tracker, displays),
each passed as one event: every stage must show, write and keep a run exactly as the same lines one by one."""

import gc
import io
import json
import random
import sys

from notebook_launcher.display.state import RunState
from notebook_launcher.display.text import TextDisplay
from notebook_launcher.schema.events import LOG, LOG_FRAME, RECORD_KEYS, STREAM, Event
from notebook_launcher.schema.lines import EventList, LogRecords, StreamLines, expand_lines
from notebook_launcher.schema.runlog import RunLog
from notebook_launcher.supervision.failure import FailureTracker
from notebook_launcher.supervision.ordering import InOrderRelease

TEXTS = ["plain", "", "with \"quotes\" and \\ backslash", "tab\there", "é ünïcode ✓ 中文", "\x1b[31mred\x1b[0m",
         "a | pipe", "x" * 3000, "line\u2028separator", "nul \x00 byte"]


def random_lines(seed: int, count: int = 400) -> list[Event]:
    """Lines of two ranks as the demux makes them: stream lines that share a read's time, and log records."""
    rng = random.Random(seed)
    events, seq = [], {0: 0, 1: 0}
    when = 100.0
    rank = 0
    for _ in range(count):
        rank = rank if rng.random() < 0.7 else 1 - rank  # (runs of one rank's lines, as a read brings them)
        seq[rank] += 1
        if rng.random() < 0.2:
            when += rng.random()
        if rng.random() < 0.3:
            data = {"level": rng.choice(("INFO", "WARNING", "")), "levelno": 20, "logger": rng.choice(("train", "a.b")),
                    "message": rng.choice(TEXTS + ["two\nlines"]), "file": "/x.py", "line": 3, "function": "f",
                    "created": 1.7e9 + rng.random(), "worker_seq": rng.randrange(1, 10**6)}
            if rng.random() < 0.2:
                data["exc_text"] = "Traceback (most recent call last):\n  boom"
            events.append(Event(rank, seq[rank], when + rng.random(), LOG, data if rng.random() < 0.95 else {}))
        else:
            stream = "stdout" if rng.random() < 0.8 else "stderr"
            events.append(Event(rank, seq[rank], when, STREAM, {"stream": stream, "text": rng.choice(TEXTS)}))
            for _ in range(rng.choice((0, 0, 1, 5))):  # a run of prints in one read
                seq[rank] += 1
                events.append(Event(rank, seq[rank], when, STREAM, {"stream": stream, "text": rng.choice(TEXTS)}))
    return events


def as_the_demux_passes_them(events: list[Event]) -> list:
    """The same lines as the demux passes them on: each run of stream lines of one rank, stream and read (and
    numbered one after the other) as one ``StreamLines``; each run of get_logger records of one rank (as record
    frames bring them: the usual keys, of the usual types) as one ``LogRecords``; other log records as they are."""
    lines: list = []
    for event in events:
        last = lines[-1] if lines else None
        if event.kind == LOG and tuple(event.data) == RECORD_KEYS:
            frame = (LOG_FRAME, event.time, *event.data.values())
            if type(last) is LogRecords and (last.rank, last.seq + len(last)) == (event.rank, event.seq):
                last.frames.append(frame)
            else:
                lines.append(LogRecords(event.rank, event.seq, [frame]))
        elif event.kind != STREAM:
            lines.append(event)
        elif type(last) is StreamLines and (last.rank, last.stream, last.time, last.seq + len(last.texts)) == (
                event.rank, event.data["stream"], event.time, event.seq):
            last.texts.append(event.data["text"])
        else:
            lines.append(StreamLines(event.rank, event.seq, event.time, event.data["stream"], [event.data["text"]]))
    return lines


def test_the_run_log_writes_a_list_of_lines_as_it_writes_each_one(runs_dir):
    events = random_lines(1)
    one_by_one, together = RunLog(str(runs_dir)), RunLog(str(runs_dir))
    for event in events:
        one_by_one.write(event)
    for start in range(0, len(events), 37):
        for item in as_the_demux_passes_them(events[start:start + 37]):
            together.write(item)
    one_by_one.close()
    together.close()
    with open(one_by_one.file("events.jsonl"), encoding="utf-8") as first, \
            open(together.file("events.jsonl"), encoding="utf-8") as second:
        written = [json.loads(line) for line in second]
        assert written == [json.loads(line) for line in first]
    assert written == [json.loads(json.dumps(event.to_json())) for event in events]


def test_run_events_give_back_the_lines_kept_and_the_collector_does_not_track_them():
    events = random_lines(2)
    kept = EventList()
    kept.append(Event(0, 0, 1.0, "status", {"state": "running"}))
    lines = as_the_demux_passes_them(events)
    assert sum(type(line) is StreamLines and len(line) > 2 for line in lines) > 10  # (runs, not single lines only)
    assert sum(type(line) is LogRecords for line in lines) > 10 and any(len(line) > 1 for line in lines
                                                                        if type(line) is LogRecords)
    kept.extend_lines(lines)
    assert list(kept) == [Event(0, 0, 1.0, "status", {"state": "running"}), *events]
    assert [kept[index] for index in range(-len(kept), len(kept))] == [*kept, *kept]  # each found by its index
    assert kept[1] == events[0] and kept[-1] == events[-1] and kept[1:3] == events[:2] and len(kept) == len(events) + 1
    assert kept[::50] == [Event(0, 0, 1.0, "status", {"state": "running"}), *events[49::50]]
    kept.extend_lines([StreamLines(0, 999, 1.0, "stdout", []), LogRecords(1, 999, [])])  # empty runs: no lines
    assert len(kept) == len(events) + 1 and list(kept)[-1] == events[-1]
    gc.collect()
    gc.collect()  # (a tuple is untracked once what it holds is: a record's first keys' tuple, on the pass before)
    tracked = sum(gc.is_tracked(item) for item in kept._items[1:])
    assert tracked == 0  # strings and numbers only: the collector has nothing to walk


def test_the_text_display_prints_a_list_of_lines_as_it_prints_each_one(monkeypatch):
    events = random_lines(3)
    outputs = []
    for feed in ("one by one", "together"):
        out, err, merged = io.StringIO(), io.StringIO(), []
        monkeypatch.setattr(sys, "stdout", Tee(out, merged, "out"))
        monkeypatch.setattr(sys, "stderr", Tee(err, merged, "err"))
        display = TextDisplay("[rank ${rank}] ")
        if feed == "one by one":
            for event in events:
                display.show(event)
        else:
            for start in range(0, len(events), 50):
                for item in as_the_demux_passes_them(events[start:start + 50]):
                    display.show(item)
        outputs.append((out.getvalue(), err.getvalue(), [stream for stream, _ in merged]))
        monkeypatch.undo()
    assert outputs[0][:2] == outputs[1][:2]
    assert "[rank 0] plain\n" in outputs[0][0] + outputs[0][1]
    assert _runs(outputs[0][2]) == _runs(outputs[1][2])  # stdout and stderr take their turns as before


def test_the_panel_state_folds_a_list_of_lines_as_it_folds_each_one():
    events = random_lines(4)
    for lines_per_rank, chunk in ((200, len(events)), (7, 23), (1, 5)):  # (runs longer than a column, and shorter)
        states = [RunState("run", "/tmp/run", "cpu", "gloo", "fork", 2, 2, [0, 1], lines_per_rank) for _ in range(2)]
        states[1]._started = states[0]._started
        for start in range(0, len(events), chunk):
            for event in events[start:start + chunk]:
                states[0].observe(event)
            for item in as_the_demux_passes_them(events[start:start + chunk]):
                states[1].observe(item)
            if start % (3 * chunk) == 0:  # (read now and then, as the panel's updates do)
                assert states[1].to_json()["ranks"] == states[0].to_json()["ranks"]
        assert states[1].to_json()["ranks"] == states[0].to_json()["ranks"]
        assert states[1].changes == states[0].changes


def test_the_failure_tracker_keeps_the_same_context_from_a_list_of_lines():
    events = random_lines(5)
    trackers = [FailureTracker(), FailureTracker()]
    for event in events:
        trackers[0].observe(event)
    for rank in (0, 1):
        for item in as_the_demux_passes_them([event for event in events if event.rank == rank]):
            trackers[1].observe(item)
    failure = Event(1, 999, 200.0, "failure", {"type": "ValueError", "message": "boom", "traceback": ""})
    for tracker in trackers:
        tracker.observe(failure)
    assert trackers[1].failures()[1].last_stderr == trackers[0].failures()[1].last_stderr
    assert trackers[1]._last_line == trackers[0]._last_line


class Tee(io.TextIOBase):
    def __init__(self, target, merged, name):
        self.target, self.merged, self.name = target, merged, name

    def write(self, text):
        self.merged.append((self.name, text))
        return self.target.write(text)


def _runs(streams):
    """The order of turns between stdout and stderr (consecutive writes to one stream are one turn)."""
    return [stream for index, stream in enumerate(streams) if index == 0 or streams[index - 1] != stream]


def test_a_run_held_behind_in_order_records_comes_out_whole_and_in_its_place():
    """While rank 0's in_order record waits for rank 1's, rank 0's later prints wait behind it, as a run whole
    or line by line alike; rank 1's own prints go on at once."""
    held = Event(0, 1, 1.0, LOG, {"message": "first", "in_order": 1})
    prints0 = StreamLines(0, 2, 1.1, "stdout", ["a", "b", "c"])
    prints1 = StreamLines(1, 1, 1.2, "stdout", ["x", "y"])
    answer = Event(1, 3, 1.3, LOG, {"message": "first of rank 1", "in_order": 1})
    shown = {}
    for feed in ("runs", "lines"):
        out: list = []
        order = InOrderRelease([0, 1], out.append)
        for item in (held, prints0, prints1, answer):
            for each in ([item] if feed == "runs" else expand_lines([item])):
                order.push(each)
        order.release(everything=True)
        shown[feed] = [(event.rank, event.data.get("text") or event.data["message"]) for event in expand_lines(out)]
        if feed == "runs":
            assert prints0 in out and prints1 in out  # (each run passed on as one)
    assert shown["runs"] == shown["lines"] == [(1, "x"), (1, "y"), (0, "first"), (0, "a"), (0, "b"), (0, "c"),
                                               (1, "first of rank 1")]
