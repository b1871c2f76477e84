"""Where the time of one log line goes, stage by stage, in this one process (no launch, no pipe reader).

Run: ``.venv/bin/python benchmarks/logging_stages.py`` (about 20 s). Each stage is timed alone over 20,000 lines
(best of 5), in µs per line: the worker's side (``logging``'s LogRecord and handler machinery, our event handler,
the frame written to a pipe), a FileHandler's whole call for comparison, and the kernel's side (decoding the
frames into events, the run log line, the in-order buffer, the text display, the panel's state). The kernel's
stages add up to what one line costs the launching process; ``logging_throughput.py`` measures the whole.
The headline: our logger's whole call over the FileHandler's. ``--lines`` sets the 20,000.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import marshal
import os
import sys
import tempfile
import time
from timeit import repeat

from common import arguments, finish, parse

from notebook_launcher.display.state import RunState
from notebook_launcher.display.text import TextDisplay
from notebook_launcher.rank import context
from notebook_launcher.rank import logging as nl_logging
from notebook_launcher.schema.events import FRAME_HEADER, LOG, LOG_FRAME, MARSHAL_VERSION, EventWriter, encode_frame
from notebook_launcher.schema.lines import EventList, expand_lines
from notebook_launcher.schema.runlog import RunLog
from notebook_launcher.supervision.demux import LINES_READ_BYTES, RankDemux
from notebook_launcher.supervision.ordering import InOrderRelease

N = 20_000  # lines per stage (--lines)


def per_line(function, lines: int | None = None) -> float:
    return min(repeat(function, number=1, repeat=5)) / (lines or N) * 1e6


def worker_side(directory: str) -> dict:
    read, write = os.pipe()
    os.set_blocking(read, False)
    fcntl.fcntl(write, 1031, 1 << 20)  # F_SETPIPE_SZ, as a rank's pipe: a block of calls fits, drained after it

    def drain():
        with contextlib.suppress(BlockingIOError):
            while os.read(read, 1 << 20):
                pass

    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers[:] = []
    writer = EventWriter(write, 0)
    context.enter(context.RankContext(writer=writer))  # as a rank: its records go to the writer
    nl_logging.install_event_logging([])
    os.environ["RANK"] = "0"
    logger = nl_logging.get_logger("bench", log_level="INFO")
    plain = logging.getLogger("bench.plain")
    record = plain.makeRecord("bench", logging.INFO, __file__, 1, "line %d of rank %d", (1, 0), None, "f")
    handler = root.handlers[-1]
    data = {"level": "INFO", "levelno": 20, "logger": "bench", "message": "line 1 of rank 0", "file": __file__,
            "line": 1, "function": "f", "created": 0.0}

    def calls(call, lines=1000):
        def run():
            for i in range(lines):
                call(i)
            drain()
        return per_line(run, lines)

    file_logger = logging.getLogger("bench.file")
    file_logger.propagate = False
    file_handler = logging.FileHandler(os.path.join(directory, "file.log"))
    file_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    file_logger.addHandler(file_handler)
    file_logger.setLevel(logging.INFO)
    stdout = sys.stdout
    try:
        try:
            from notebook_launcher.rank.streams import FdTextStream, one_write_print
        except ImportError:  # (an older checkout: the streams were in worker.py, print was Python's)
            from notebook_launcher.rank.worker import FdTextStream

            def one_write_print(original):
                return original
        sys.stdout = stream = FdTextStream(write, "<stdout>", writer)
        printer = one_write_print(print)
        return {
            "get_logger(...).info, whole call": calls(lambda i: logger.info("line %d of rank %d", i, 0,
                                                                             main_process_only=False)),
            "  LogRecord (makeRecord)": per_line(lambda: [plain.makeRecord(
                "bench", logging.INFO, __file__, 1, "line %d of rank %d", (i, 0), None, "f") for i in range(N)]),
            "  our handler's emit of a LogRecord (frame + write)": calls(lambda i: handler.emit(record)),
            "  frame encoding (encode_frame)": per_line(lambda: [encode_frame(0, i, LOG, data) for i in range(N)]),
            "  the frame's os.write to a pipe": calls(lambda i, frame=encode_frame(0, 1, LOG, data):
                                                     os.write(write, frame)),
            "print(...), whole call": calls(lambda i: printer("line %d of rank %d" % (i, 0))),
            "  sys.stdout.write, one event": calls(lambda i: stream.write("line 1 of rank 0\n")),
            "FileHandler, whole call (same message and format)": calls(lambda i: file_logger.info(
                "line %d of rank %d", i, 0)),
        }
    finally:
        sys.stdout = stdout
        root.handlers[:] = saved
        context.enter(context.OUTSIDE)
        file_handler.close()
        os.close(read)
        os.close(write)


def compact_frame(header: tuple) -> bytes:
    payload = marshal.dumps(header, MARSHAL_VERSION)
    return FRAME_HEADER.pack(len(payload), 0) + payload


def kernel_side(directory: str) -> dict:
    now, epoch = time.monotonic(), time.time()  # (times with all their digits: their repr is half a line's cost)
    frames = b"".join(compact_frame((LOG_FRAME, now + i * 3.7e-6, "INFO", 20, "bench", f"line {i} of rank 0",
                                     __file__, 1, "log_lines", epoch + i * 3.7e-6, i))
                      for i in range(N))  # as a worker's get_logger sends them (EventWriter.emit_record)
    prints = b"".join(compact_frame((0, f"line {i} of rank 0\n")) for i in range(N))  # and its print (emit_text)
    record_lists, print_lists = demuxed(frames), demuxed(prints)  # what the demux passes on, read by read
    events = expand_lines(record_lists)
    run_log = RunLog(os.path.join(directory, "runs"))
    text = TextDisplay("[rank ${rank}] ")
    order = InOrderRelease([0, 1], lambda event: None)
    sink = io.StringIO()

    def show():
        with contextlib.redirect_stdout(sink):
            for event in events:
                text.show(event)

    def show_runs(runs):
        with contextlib.redirect_stdout(sink):
            for run in runs:
                text.show(run)

    def each(stage, runs):
        return lambda: [stage(run) for run in runs]

    def panel(runs):
        state = RunState("bench", directory, "cpu", "gloo", "fork", 2, 2, range(2))
        for run in runs:
            state.observe(run)
        return state.to_json()  # (the panel's lines are made when it is read)

    try:
        return {
            "decode record frames (RankDemux.feed, 32 KB reads)": per_line(lambda: demuxed(frames)),
            "decode print frames": per_line(lambda: demuxed(prints)),
            "run log line, one by one (RunLog.write)": per_line(lambda: [run_log.write(event) for event in events]),
            "run log, records as the demux passes them (runs)": per_line(each(run_log.write, record_lists)),
            "run log, prints as the demux passes them": per_line(each(run_log.write, print_lists)),
            "Run.events, records kept (EventList.extend_lines)": per_line(lambda: EventList().extend_lines(
                record_lists)),
            "in-order buffer, one by one (InOrderRelease.push)": per_line(lambda: [order.push(event) for event in events]),
            "text display, one by one (TextDisplay.show, to a StringIO)": per_line(show),
            "text display, record runs (show)": per_line(lambda: show_runs(record_lists)),
            "text display, print runs": per_line(lambda: show_runs(print_lists)),
            "panel state, one by one (RunState.observe)": per_line(lambda: panel(events)),
            "panel state, record runs, then read (observe)": per_line(lambda: panel(record_lists)),
            "panel state, prints together, then read": per_line(lambda: panel(print_lists)),
        }
    finally:
        run_log.close()


def demuxed(frames: bytes) -> list:
    """The runs of lines the demux passes on for ``frames`` read as a flood is, 32 KB at a time."""
    demux, lists = RankDemux(0), []
    for start in range(0, len(frames), LINES_READ_BYTES):
        lists += demux.feed("events", frames[start:start + LINES_READ_BYTES])
    return lists


def main(argv=None) -> int:
    global N
    parser = arguments(__doc__, "logging_stages")
    parser.add_argument("--lines", type=int, default=N, help=f"lines per stage (default {N:,})")
    args = parse(parser, argv, smoke={"lines": 500})
    N = args.lines
    with tempfile.TemporaryDirectory() as directory:
        results = {"worker": worker_side(directory), "kernel": kernel_side(directory)}
    for side, stages in results.items():
        print(f"{side} side, µs per line")
        for name, micros in stages.items():
            print(f"  {name:58s} {micros:6.2f}")
    worker = results["worker"]
    return finish(args, results, {"get_logger(...).info / FileHandler": worker["get_logger(...).info, whole call"]
                                  / worker["FileHandler, whole call (same message and format)"]})


if __name__ == "__main__":
    sys.exit(main())
