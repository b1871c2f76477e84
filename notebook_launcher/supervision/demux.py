"""One rank's pipes, demultiplexed: bytes read on its event, stdout and stderr pipes in, its events out.

Knows nothing about processes (who reads the pipes, when a rank exits): it is fed what was read, channel by
channel, with ``b""`` for a channel's end, and numbers every event it makes in the order made. Everything fed
is untrusted: a corrupt or unfinished event stream becomes one failure event, never an exception, and the
lines before it are kept.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

from ..schema.decoding import FrameDecoder, LineSplitter, event_from_frame
from ..schema.events import (
    CORRUPT_EVENT_STREAM,
    FAILURE,
    KERNEL_ONLY_KINDS,
    LOG,
    LOG_FRAME,
    OUTPUT,
    STREAM,
    TEXT_FRAME_STREAM,
    TEXT_FRAME_TEXT,
    TEXT_STREAMS,
    TRUNCATED_EVENT,
    Event,
)
from ..schema.lines import LogRecords, StreamLines
from ..schema.results import result_sinks

CHANNELS = ("events", "stdout", "stderr")
_DUMP_HEADER = re.compile(r"(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
_DUMP_LINE = re.compile(r'  (File ".*", line \d+ in .*|<no Python frame>|\.\.\.)$')
STREAMS = ("stdout", "stderr")
LINES_READ_BYTES = 32 << 10


class RankDemux:
    """The events of one rank, numbered per rank (``seq`` is the last number given).

    What ``feed`` yields are events and runs of plain lines: consecutive ``stream`` lines of one stream and read
    (one ``StreamLines``) and consecutive record frames (one ``LogRecords``), which the kernel passes on as one
    event each (one call per stage for hundreds of lines, not one per line; see ``lines.py``). Both are made
    lazily, as the caller iterates, so their numbers follow the order in which the caller passes them
    on. A rank's text arrives two ways, each cut into lines by a splitter of its own: what its fd 1/2 pipes carry
    (C++ and subprocess output, and faulthandler's stack dumps) and Python-level writes sent as ``output`` events
    on the event pipe.
    """

    def __init__(self, rank: int, sinks=result_sinks):
        self.rank = rank
        self.seq = 0
        self._decoder = FrameDecoder(sinks, refused_kinds=KERNEL_ONLY_KINDS, rank_pipe=True)
        self._broken_reported = False
        self._fd_lines: dict[str, LineSplitter] = {stream: LineSplitter() for stream in STREAMS}
        self._python_lines: dict[str, LineSplitter] = {}  # stream name -> splitter of its ``output`` events
        self._dump: str | None = None  # None | "expected" | "in": a faulthandler dump the kernel asked for
        self._torch_prefix = f"[rank{rank}]:"  # what torch's C++ log puts before each line of this rank's

    def feed(self, channel: str, chunk: bytes) -> Iterator[Event | StreamLines | LogRecords]:
        """The events and lists of plain lines in ``chunk`` read on ``channel`` (one of CHANNELS); ``b""``: the
        channel's end (EOF)."""
        if channel == "events":
            return self._feed_events(chunk)
        return self._feed_stream(channel, chunk)

    def _feed_events(self, chunk: bytes) -> Iterator[Event | StreamLines | LogRecords]:
        decoder = self._decoder
        rank = self.rank
        lines: list = []  # the runs (and log Events) of the frames so far, passed on in order (see the class)
        now = time.monotonic()  # (every line cut from this chunk was read at this moment)
        for header, attachment in decoder.feed(chunk):
            if type(header) is tuple and header[0] == LOG_FRAME:  # a record frame (events.RECORD_FRAME_FIELDS)
                self.seq += 1
                if lines and type(lines[-1]) is LogRecords:  # (then numbered just before this one)
                    lines[-1].frames.append(header)
                else:
                    lines.append(LogRecords(rank, self.seq, [header]))
            elif type(header) is tuple or header["kind"] == OUTPUT:  # a text frame (0 | 1, text), or an output event
                if type(header) is tuple:
                    stream, text = TEXT_STREAMS[header[TEXT_FRAME_STREAM]], header[TEXT_FRAME_TEXT]
                else:
                    stream = "stderr" if header["data"].get("stream") == "stderr" else "stdout"
                    text = str(header["data"].get("text", ""))
                stray = self._output_lines(stream, text, lines, now)
                if stray is None:
                    continue
                if lines:
                    yield from lines
                    lines = []
                yield stray
            elif header["kind"] == LOG and "in_order" not in header["data"]:
                self.seq += 1
                header["rank"] = rank  # the pipe says who wrote it
                lines.append(event_from_frame(header, attachment, self.seq))
            else:
                if lines:
                    yield from lines
                    lines = []
                self.seq += 1
                header["rank"] = rank
                yield event_from_frame(header, attachment, self.seq)
        if lines:
            yield from lines
        if decoder.broken and not self._broken_reported:  # the pipe is still read (and dropped): no block
            self._broken_reported = True
            yield self.event(FAILURE, {
                "type": CORRUPT_EVENT_STREAM, "message": f"rank {self.rank} wrote bytes on its event pipe "
                f"that are not an event ({decoder.broken}); what it sent there after them is lost (its stdout "
                f"and stderr are not)", "traceback": "", "exit_code": None})
        if not chunk and decoder.pending_bytes:
            pending = decoder.pending_bytes
            decoder.discard()  # (said once, however often the end is read)
            yield self.event(FAILURE, {
                "type": TRUNCATED_EVENT, "message": f"{pending} bytes of an unfinished event "
                "(the worker died while writing it)", "traceback": "", "exit_code": None})

    def read_size(self, channel: str, most: int) -> int:
        """How much to read next on ``channel``: ``LINES_READ_BYTES``, or up to ``most`` while one long frame or
        line is arriving (a result, a line of megabytes). The lines of one read are alive together until passed
        on: a 1 MB read of 25,000 frames kept so many objects alive through Python's collections that the
        collector then walked the whole heap again and again (twice the kernel's time per line)."""
        if channel == "events":
            return min(most, max(LINES_READ_BYTES, self._decoder.frame_pending))
        return most if self._fd_lines[channel].partial_bytes >= LINES_READ_BYTES else LINES_READ_BYTES

    def expect_stack_dump(self) -> None:
        """The kernel asked for this rank's stacks: the faulthandler dump coming on stderr is marked
        ``stack_dump`` (the displays leave it out and show the stacks cleaned in the notice or the message;
        the run log keeps it)."""
        self._dump = "expected"

    def _feed_stream(self, stream: str, chunk: bytes) -> Iterator[Event | StreamLines | LogRecords]:
        splitter = self._fd_lines[stream]
        lines = splitter.feed(chunk) if chunk else splitter.finish()
        prefix = self._torch_prefix
        if any(line.startswith(prefix) for line in lines):  # the rank is named once, by us: not "[rank1]:" again
            lines = [line[len(prefix):] if line.startswith(prefix) else line for line in lines]
        if stream == "stderr" and self._dump:
            for line in lines:
                data = {"stream": stream, "text": line}
                if self._in_dump(line):
                    data["stack_dump"] = True
                yield self.event(STREAM, data)
        elif lines:
            batch: list = []
            self._add_lines(batch, stream, lines, time.monotonic())
            yield from batch
        redraw = self._redraw(stream, splitter)
        if redraw is not None:
            yield redraw

    def _in_dump(self, line: str) -> bool:
        if _DUMP_HEADER.match(line):
            self._dump = "in"
            return True
        if self._dump == "in" and (not line or _DUMP_LINE.match(line)):
            return True
        if self._dump == "in":
            self._dump = None  # the dump is over: later lines are the rank's own
        return False

    def _output_lines(self, stream: str, text: str, lines: list, now: float) -> Event | None:
        """Python-level text, cut into lines added to ``lines``; the redrawn state of an unfinished line (a
        progress bar), which is not a plain line, is returned."""
        splitter = self._python_lines.get(stream) or self._python_lines.setdefault(stream, LineSplitter())
        self._add_lines(lines, stream, splitter.feed_text(text), now)
        return self._redraw(stream, splitter)

    def _add_lines(self, lines: list, stream: str, texts: list[str], now: float) -> None:
        """``texts`` as ``stream`` lines numbered next, at the end of ``lines``: added to its last ``StreamLines``
        when that is of the same stream and read (a flood of prints is a few of them, not an Event a line)."""
        if not texts:
            return
        last = lines[-1] if lines else None
        if type(last) is StreamLines and last.stream == stream and last.time == now:
            last.texts += texts
        else:
            lines.append(StreamLines(self.rank, self.seq + 1, now, stream, texts))
        self.seq += len(texts)

    def _redraw(self, stream: str, splitter: LineSplitter) -> Event | None:
        """A line redrawn in place (a progress bar) is passed on as it changes, marked so it is not a new line."""
        latest = splitter.redraw()
        return None if latest is None else self.event(STREAM, {"stream": stream, "text": latest, "redraw": True})

    def finish_python_lines(self) -> Iterator[Event]:
        """Once the rank has exited: a last line it printed from Python without a newline."""
        for stream in STREAMS:
            splitter = self._python_lines.get(stream)
            for line in splitter.finish() if splitter else []:
                yield self.event(STREAM, {"stream": stream, "text": line})

    def abandon(self, channel: str) -> Iterator[Event]:
        """A channel closed before its end (a descendant that escaped the rank still holds the pipe open): the
        last unfinished line of a stream channel; an event channel's unfinished frame is dropped."""
        splitter = self._fd_lines.get(channel)
        for line in splitter.finish() if splitter else []:
            yield self.event(STREAM, {"stream": channel, "text": line})

    def event(self, kind: str, data: dict) -> Event:
        """An event of the kernel's about this rank (its exit, a failure it could not report), numbered next."""
        self.seq += 1
        return Event(rank=self.rank, seq=self.seq, time=time.monotonic(), kind=kind, data=data)
