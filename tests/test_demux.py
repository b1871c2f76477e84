"""One rank's pipes demultiplexed: bytes in, events out (no process involved)."""

import struct

from notebook_launcher.schema.events import (
    CORRUPT_EVENT_STREAM,
    FAILURE,
    LOG,
    OUTPUT,
    STREAM,
    TRUNCATED_EVENT,
    encode_frame,
)
from notebook_launcher.schema.lines import expand_lines
from notebook_launcher.supervision.demux import RankDemux


def flat(items):
    """What the demux yields, as events: its runs of plain lines opened."""
    return expand_lines(items)


def lines(events, stream=None):
    return [e.data["text"] for e in events if e.kind == STREAM and not e.data.get("redraw")
            and (stream is None or e.data["stream"] == stream)]


def test_frames_and_fd_output_become_numbered_events_of_the_pipes_rank():
    demux = RankDemux(rank=3)
    events = []
    first = encode_frame(7, 1, LOG, {"message": "hello"})  # a header may claim any rank
    events += flat(demux.feed("events", first + encode_frame(3, 2, OUTPUT, {"stream": "stdout",
                                                                           "text": "printed in two wri"})))
    events += flat(demux.feed("events", encode_frame(3, 3, OUTPUT, {"stream": "stdout", "text": "tes\nand a last"})))
    events += flat(demux.feed("stderr", b"from C++\nno newline"))
    events += flat(demux.feed("stderr", b""))  # the pipe's end: its last line even without a newline
    events += flat(demux.finish_python_lines())  # the rank exited: its last Python line too
    assert [e.rank for e in events] == [3] * len(events)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert demux.seq == len(events)
    assert events[0].kind == LOG and events[0].data["message"] == "hello" and events[0].data["worker_seq"] == 1
    assert lines(events, "stdout") == ["printed in two writes", "and a last"]
    assert lines(events, "stderr") == ["from C++", "no newline"]


def test_a_line_redrawn_in_place_is_passed_on_as_a_redraw_then_as_its_last_state():
    demux = RankDemux(rank=0)
    events = flat(demux.feed("stdout", b" 10%\r 50%"))
    events += flat(demux.feed("stdout", b"\r100%\n"))
    assert [(e.data["text"], e.data.get("redraw", False)) for e in events] == [(" 50%", True), ("100%", False)]


def test_a_corrupt_frame_is_one_failure_and_the_lines_before_it_are_kept():
    demux = RankDemux(rank=1)
    before = encode_frame(1, 1, OUTPUT, {"stream": "stdout", "text": "the last line before the garbage\n"})
    garbage = struct.pack(">II", 5, 0) + b"\xff\xfe\xfd\xfc\xfb"  # a header that is not marshal
    after = encode_frame(1, 2, OUTPUT, {"stream": "stdout", "text": "sent after it: lost\n"})
    events = flat(demux.feed("events", before + garbage + after))
    events += flat(demux.feed("events", after))  # the pipe is still read, and dropped
    events += flat(demux.feed("events", b""))
    events += flat(demux.feed("stdout", b"fd output is not lost\n"))
    assert lines(events) == ["the last line before the garbage", "fd output is not lost"]
    failures = [e for e in events if e.kind == FAILURE]
    assert len(failures) == 1
    assert failures[0].data["type"] == CORRUPT_EVENT_STREAM
    assert failures[0].data["message"].startswith("rank 1 wrote bytes on its event pipe that are not an event")


def test_an_event_cut_short_at_the_pipes_end_is_a_truncated_event_failure():
    demux = RankDemux(rank=0)
    whole = encode_frame(0, 1, LOG, {"message": "complete"})
    cut = encode_frame(0, 2, LOG, {"message": "x" * 100})[:40]
    events = flat(demux.feed("events", whole + cut))
    events += flat(demux.feed("events", b""))
    assert [e.kind for e in events] == [LOG, FAILURE]
    assert events[1].data["type"] == TRUNCATED_EVENT and events[1].data["message"].startswith("40 bytes of an unfinished event")


DUMP = (b'Current thread 0x00007f0000000001 (most recent call first):\n'
        b'  File "/x/train.py", line 12 in step\n  File "/x/train.py", line 30 in main\n\n'
        b'Thread 0x00007f0000000002 (most recent call first):\n  <no Python frame>\n')


def test_a_stack_dump_the_kernel_asked_for_is_marked_and_the_ranks_own_lines_are_not():
    demux = RankDemux(rank=0)
    events = flat(demux.feed("stderr", DUMP))  # not asked for: a rank may print such lines itself
    assert not [e for e in events if e.data.get("stack_dump")]
    demux.expect_stack_dump()
    events = flat(demux.feed("stderr", b"a warning first\n" + DUMP + b"the rank's own line after\n"))
    marked = [e.data["text"] for e in events if e.data.get("stack_dump")]
    assert marked == [line.decode() for line in DUMP.split(b"\n")[:-1]]
    assert [e.data["text"] for e in events if not e.data.get("stack_dump")] == ["a warning first",
                                                                              "the rank's own line after"]
    assert not flat(demux.feed("stderr", DUMP))[0].data.get("stack_dump")  # one dump per request


def test_a_run_of_plain_lines_is_one_item_and_anything_else_between_them_keeps_its_place():
    from notebook_launcher.schema.events import STATUS

    demux = RankDemux(rank=2)
    chunk = (encode_frame(2, 1, OUTPUT, {"stream": "stdout", "text": "one\ntwo\n"})
             + encode_frame(2, 2, LOG, {"message": "a record"})
             + encode_frame(2, 3, STATUS, {"state": "running"})  # not a line: passed on alone, in its place
             + encode_frame(2, 4, LOG, {"message": "in order", "in_order": 1})  # held for rank order: alone
             + encode_frame(2, 5, OUTPUT, {"stream": "stderr", "text": "three\n"}))
    items = list(demux.feed("events", chunk))
    assert [item.kind for item in items] == [STREAM, LOG, "status", LOG, STREAM]
    assert [type(item).__name__ for item in items] == ["StreamLines", "Event", "Event", "Event", "StreamLines"]
    assert [len(item.texts) for item in items if type(item).__name__ == "StreamLines"] == [2, 1]  # a run is one
    assert [e.seq for e in flat(items)] == [1, 2, 3, 4, 5, 6]
    fd_lines = list(demux.feed("stdout", b"from C\nand more\n"))
    assert [type(item).__name__ for item in fd_lines] == ["StreamLines"]
    assert [e.data["text"] for e in flat(fd_lines)] == ["from C", "and more"]
    assert [e.seq for e in flat(fd_lines)] == [7, 8]


def test_consecutive_prints_of_one_read_are_one_run_of_lines_and_a_stream_change_starts_another():
    demux = RankDemux(rank=0)
    chunk = b"".join(text_frame((0, f"out {i}\n")) for i in range(5)) + text_frame((1, "err\n")) + \
        text_frame((0, "a\nb\n")) + text_frame((0, "no end"))
    lines = list(demux.feed("events", chunk))
    assert [(item.stream, item.seq, item.texts) for item in lines] == [
        ("stdout", 1, [f"out {i}" for i in range(5)]), ("stderr", 6, ["err"]), ("stdout", 7, ["a", "b"])]
    assert len({item.time for item in lines}) == 1
    more = list(demux.feed("events", text_frame((0, ", ended\n"))))
    assert [(item.seq, item.texts) for item in more] == [(9, ["no end, ended"])]


def text_frame(header) -> bytes:
    import marshal

    payload = marshal.dumps(header, 2)
    return struct.pack(">II", len(payload), 0) + payload


RECORD = ("INFO", 20, "train", "a record", "/x.py", 3, "f", 1.7e9)  # RECORD_KEYS' values, worker_seq aside


def test_compact_frames_are_prints_and_log_records_and_a_malformed_one_is_a_corrupt_stream():
    demux = RankDemux(rank=1)
    items = list(demux.feed("events", text_frame((0, "printed\nand more\n")) + text_frame((1, "to stderr\n"))
                            + text_frame((2, 12.5, *RECORD, 7)) + text_frame((2, 13.5, *RECORD, 8))))
    assert [type(item).__name__ for item in items] == ["StreamLines", "StreamLines", "LogRecords"]
    events = flat(items)
    assert [(e.data["stream"], e.data["text"]) for e in events[:3]] == [
        ("stdout", "printed"), ("stdout", "and more"), ("stderr", "to stderr")]
    assert [(e.kind, e.seq, e.time) for e in events[3:]] == [(LOG, 4, 12.5), (LOG, 5, 13.5)]
    assert events[3].data == {"level": "INFO", "levelno": 20, "logger": "train", "message": "a record",
                              "file": "/x.py", "line": 3, "function": "f", "created": 1.7e9, "worker_seq": 7}
    wrong_types = [(2, 1.0, *RECORD[:index], value, *RECORD[index + 1:], 7)
                   for index, value in enumerate((None, 20.0, b"train", 5, None, True, 0, 1))]
    for bad in ((3, "no such stream"), (0, b"bytes"), (0,), (0, "x", 1), (True, "a bool is no stream"), [0, "x"],
                (2, 1, 1.0), (2, 1, 1.0, {}), (2, 1.0, *RECORD), (2, 1.0, *RECORD, 7, 8), (2, "now", *RECORD, 7),
                (2, 1.0, *RECORD, 7.0), (3, 1.0, *RECORD, 7), *wrong_types):
        demux = RankDemux(rank=1)
        events = flat(demux.feed("events", text_frame((0, "before\n")) + text_frame(bad)))
        assert lines(events) == ["before"], bad
        assert [e.data["type"] for e in events if e.kind == FAILURE] == [CORRUPT_EVENT_STREAM], bad


def test_a_log_record_whose_in_order_is_no_count_is_a_corrupt_stream_not_a_kernel_error():
    for bad in ("x", [1], True, 0, -3, 1.5):
        demux = RankDemux(rank=0)
        frame = encode_frame(0, 2, LOG, {"message": "m", "in_order": bad})
        events = flat(demux.feed("events", text_frame((0, "before\n")) + frame))
        assert lines(events) == ["before"], bad
        assert [e.data["type"] for e in events if e.kind == FAILURE] == [CORRUPT_EVENT_STREAM], bad
    good = flat(RankDemux(rank=0).feed("events", encode_frame(0, 2, LOG, {"message": "m", "in_order": 4})))
    assert good[0].data["in_order"] == 4


def test_an_int_too_long_to_write_or_data_nested_too_deep_is_a_corrupt_stream_not_a_kernel_error():
    """Python refuses to turn an int of more than 4,300 digits into text: the kernel would raise where it logs or
    shows it. A worker may send one anywhere; so also data nested deeper than anyone writes."""
    huge = 10 ** 5000
    nested: list = []
    for _ in range(100):
        nested = [nested]
    for frame in (text_frame((2, 1.0, *RECORD[:1], huge, *RECORD[2:], 7)),  # a record's levelno
                  text_frame((2, 1.0, *RECORD[:5], -huge, *RECORD[6:], 7)),  # its line
                  text_frame((2, 1.0, *RECORD, 2 ** 64)),  # its worker_seq
                  encode_frame(0, 2, "progress", {"step": huge, "total": 10, "metrics": {}}),
                  encode_frame(0, 2, "progress", {"step": 1, "metrics": {"loss": [1, {huge}]}}),
                  encode_frame(0, 2, "log", {"message": "m", "in_order": 1, "line": huge}),
                  encode_frame(0, huge, "status", {"state": "running"}),
                  encode_frame(0, 2, "progress", {"step": 1, "metrics": {"deep": nested}})):
        demux = RankDemux(rank=0)
        events = flat(demux.feed("events", text_frame((0, "before\n")) + frame))
        assert lines(events) == ["before"], frame[:40]
        assert [e.data["type"] for e in events if e.kind == FAILURE] == [CORRUPT_EVENT_STREAM], frame[:40]
    fine = flat(RankDemux(rank=0).feed("events", text_frame((2, 1.0, *RECORD, 2 ** 63 - 1))
                                       + encode_frame(0, 3, "progress", {"step": -(2 ** 63), "metrics": {}})))
    assert [e.kind for e in fine] == [LOG, "progress"]
