"""The run log on disk: one private folder per run (every event as JSON lines, and a summary), pruned.

What is written is strict JSON: a NaN or an infinity (a time, a figure a rank sent) is written as null. What is
read back is read with bounds, whoever wrote the folder (``open_run_file``, ``RunFileLines``, ``parse_record``):
only regular files inside the run's folder (never a link out of it, a FIFO or a device), at most
``MAX_LOG_BYTES`` of events.jsonl, lines of at most ``MAX_RECORD_BYTES``, and records of the shape written here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import time
import warnings
from collections.abc import Iterator

from .events import LOG, RECORD_DATA, RECORD_KEYS, Event
from .lines import LogRecords, StreamLines
from .runfolders import (  # noqa: F401 (the runs folder's, read from here too)
    KEEP_RUNS,
    PRUNE_MIN_AGE_S,
    RUN_ID,
    RUNS_DIR_ENV_VAR,
    new_run_folder,
    prune,
    run_id,
    runs_root,
    unusable,
)

KEEPALIVE_S = 60.0  # a live run's log is touched at least this often (RunLog.tick; pruning's margin counts on it)

# json's own C encoder, called directly (json.dumps makes a new encoder at every call): compact separators
_markers: dict = {}  # (what json.dumps checks circular references with; emptied after a failed line)
# (allow_nan False: a NaN or an infinity raises, and the line is written again with null in its place)
_encode = json.encoder.c_make_encoder(_markers, str, json.encoder.encode_basestring_ascii, None, ":", ",", False,
                                      False, False) if json.encoder.c_make_encoder else json.JSONEncoder(
    default=str, separators=(",", ":"), allow_nan=False).iterencode
_string = json.encoder.encode_basestring_ascii
_STREAMS = {"stdout": '"stdout"', "stderr": '"stderr"'}


class RunLog:
    """One private directory per run: ``events.jsonl`` (every event, as it arrives) and ``run.json`` (summary).

    The log is a record, never a reason to lose a run: where the disk is full or failing (at the start or at any
    moment), writing stops, ``incomplete`` says why, one warning goes to ``report_to``'s note, and the run goes
    on. Only the newest ``KEEP_RUNS`` finished run directories are kept (see ``runfolders.prune``).
    """

    _FLUSH_EVERY_S = 0.5

    def __init__(self, root: str | None = None):
        root = root or runs_root()
        self.incomplete = ""  # why the log stopped being written ("" while it is whole)
        self._note = None
        self._events = None
        self._touched = self._last_flush = time.monotonic()
        self.run_id = run_id()  # (the name it has, even where the disk cannot hold the folder)
        self.path = os.path.join(root, self.run_id)
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            self.run_id, self.path = new_run_folder(root)
            self._events = open(os.path.join(self.path, "events.jsonl"), "w", encoding="utf-8")
        except FileExistsError as exc:
            if os.path.isdir(root):  # a run id taken every time (new_run_folder): not a folder's permissions
                raise
            raise unusable(root, exc) from exc
        except OSError as exc:
            if exc.errno not in DISK_TROUBLE:
                raise unusable(root, exc) from exc
            self._lost(exc)
        prune(root, keep=KEEP_RUNS, current=self.run_id)

    def report_to(self, note) -> None:
        """Where the one warning goes that the log is incomplete (at once, if it already is)."""
        self._note = note
        if self.incomplete:
            note(self._warning())

    def write(self, event) -> None:
        """An Event as one line; a run of lines (``lines.StreamLines``, ``LogRecords``) as a line each, in one
        write, field by field (the kernel made or checked their shape itself: no JSON encoder's walk)."""
        if self._events is None:
            return
        kind = type(event)
        if kind is StreamLines:
            head, tail = (f'{{"rank":{event.rank},"seq":', f',"time":{_number(event.time)},"kind":"stream",'
                          f'"data":{{"stream":{_STREAMS[event.stream]},"text":')
            seq = event.seq
            self._write("".join([f'{head}{seq + number}{tail}{_string(text)}}}}}\n'
                                 for number, text in enumerate(event.texts)]))
        elif kind is LogRecords:
            rank, seq = event.rank, event.seq
            self._write("".join([_record_line(rank, seq + number, frame) for number, frame in enumerate(event.frames)]))
        else:
            self._write(_line(event))

    def _write(self, text: str) -> None:
        try:
            self._events.write(text)
            now = time.monotonic()
            if now - self._last_flush > self._FLUSH_EVERY_S:
                self._events.flush()
                self._last_flush = self._touched = now
        except OSError as exc:
            self._lost(exc)

    def tick(self) -> None:
        """Called now and then while the run goes on: events.jsonl's time is moved at least every
        ``KEEPALIVE_S``, so that a quiet run is seen live by any machine's pruning (``runfolders.prune``)."""
        now = time.monotonic()
        if self._events is not None and now - self._touched > KEEPALIVE_S:
            self._touched = now
            try:
                os.utime(self._events.fileno())
            except OSError:
                pass  # (a failing disk: the next write says so)

    def write_summary(self, summary: dict) -> None:
        """run.json; where it cannot be written, the log is incomplete (never an error: the run is over)."""
        if self.incomplete:
            summary = {**summary, "log_incomplete": self.incomplete}
        try:
            with open(os.path.join(self.path, "run.json"), "w", encoding="utf-8") as out:
                json.dump(_plain(summary), out, indent=2, default=str, allow_nan=False)
        except OSError as exc:
            self._lost(exc)
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.path, "run.json"))  # not half a summary

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        if self._events is not None:
            events, self._events = self._events, None
            try:
                events.close()
            except OSError as exc:  # the last lines could not be flushed (the file is closed all the same)
                self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        """Writing failed: the log stops here (once), and says so once."""
        events, self._events = self._events, None
        if events is not None:
            with contextlib.suppress(OSError):
                events.close()
        if self.incomplete:
            return
        self.incomplete = f"{exc.strerror or exc}" + (f" (errno {exc.errno})" if exc.errno else "")
        if self._note is not None:
            self._note(self._warning())

    def _warning(self) -> str:
        return (f"warning: the run log in {self.path} is incomplete: {self.incomplete}. The run itself is not "
                f"affected (its result, status and exit codes are in last_run()); free space there, or set "
                f"{RUNS_DIR_ENV_VAR} to another folder, for the next run's log")


DISK_TROUBLE = {errno.ENOSPC, errno.EDQUOT, errno.EIO}  # a log that cannot start for these: the run goes on
def _line(event: Event) -> str:
    """The line json.dumps(event.to_json()) gives, compact, without making the dict (once per line)."""
    try:
        return (f'{{"rank":{int(event.rank)},"seq":{int(event.seq)},"time":{_number(event.time)},'
                f'"kind":{_string(str(event.kind))},"data":{"".join(_encode(event.data, 0))}'
                + (f',"attachment_bytes":{len(event.attachment)}}}\n' if event.attachment else "}\n"))
    except (TypeError, ValueError):  # data JSON cannot hold as it is (keys that are not strings, NaN, from a rank)
        _markers.clear()
        return json.dumps(_plain(event.to_json()), default=str, allow_nan=False) + "\n"


def _record_line(rank: int, seq: int, frame: tuple) -> str:
    """``_line`` of a get_logger record from its record frame (``LogRecords``: its types checked when it was
    read), written field by field: the JSON encoder's walk was 40% of the kernel's time for a record in a flood."""
    _, when, level, levelno, logger, message, file, line, function, created, worker_seq = frame  # RECORD_FRAME_FIELDS
    if when - when != 0 or created - created != 0:  # NaN or an infinity: written as null
        return _line(Event(rank, seq, when, LOG, dict(zip(RECORD_KEYS, frame[RECORD_DATA]))))
    return (f'{{"rank":{rank},"seq":{seq},"time":{when!r},"kind":"log","data":{{'
            f'"level":{_string(level)},"levelno":{levelno},"logger":{_string(logger)},"message":{_string(message)},'
            f'"file":{_string(file)},"line":{line},"function":{_string(function)},"created":{created!r},'
            f'"worker_seq":{worker_seq}}}}}\n')


def _number(value) -> str:
    value = float(value)
    return repr(value) if value - value == 0 else "null"  # NaN and infinities: null (strict JSON)


def _plain(value):
    """``value`` as strict JSON can hold it: every dict key a string, NaN and infinities None."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# -- reading a run folder back, whoever wrote it ------------------------------------------------------------------
MAX_LOG_BYTES = 2**30  # readers read at most this much of events.jsonl (and say so when they stop there)
MAX_RECORD_BYTES = 16 * 2**20  # a longer line of events.jsonl is skipped, counted as malformed (a rank's line
# is cut at 8 MB before it is written: decoding.LineSplitter)
MAX_SUMMARY_BYTES = 16 * 2**20  # a larger run.json is not read
_READ_CHUNK = 2**20


class RunFileRefused(OSError):
    """A file of a run folder that readers do not read: a link out of the folder, a FIFO, a device, a socket."""


def open_run_file(run_dir: str, name: str):
    """``run_dir/name`` opened for reading in binary, only if it is a regular file whose real path lies inside
    the run folder (a link inside the folder is followed, one out of it is not). Never blocks: a FIFO or a
    device is refused without being read. Raises ``FileNotFoundError``, or ``RunFileRefused`` saying why."""
    folder = os.path.realpath(run_dir)
    path = os.path.join(run_dir, name)
    real = os.path.realpath(path)
    if os.path.commonpath([folder, real]) != folder:
        raise RunFileRefused(f"{path} is a link out of the run folder (to {real}): not read")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise RunFileRefused(f"{path} cannot be opened ({exc.strerror or exc}): not read") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a folder" if stat.S_ISDIR(mode) else "not a file")
        raise RunFileRefused(f"{path} is {what}, not a regular file: not read")
    return os.fdopen(fd, "rb")


class RunFileLines:
    """The whole lines of a run folder's file (events.jsonl), read from where the last read stopped (a running
    run's log grows), with bounds: at most ``MAX_LOG_BYTES`` in all (then ``cut`` is True), a line longer than
    ``MAX_RECORD_BYTES`` skipped without being held (``None`` in its place, counted in ``oversized``), a line
    still being written left for the next read. ``refused``: why the file is not read (``open_run_file``)."""

    def __init__(self, run_dir: str, name: str = "events.jsonl"):
        self.run_dir, self.name = run_dir, name
        self.offset = 0  # bytes consumed: always just after a newline (or inside a line being skipped)
        self.lines = 0  # lines consumed
        self.oversized = 0
        self.cut = False
        self.refused = ""
        self._skipping = False  # inside a line over the bound, to its end

    def read(self) -> Iterator[bytes | None]:
        """The lines (without their newline) written since the last read; None for a line over the bound."""
        try:
            source = open_run_file(self.run_dir, self.name)
        except FileNotFoundError:
            return
        except RunFileRefused as exc:
            self.refused = str(exc)
            return
        self.refused = ""
        with source:
            source.seek(self.offset)
            budget = MAX_LOG_BYTES - self.offset
            pending = b""
            while budget > 0:
                chunk = source.read(min(_READ_CHUNK, budget))
                if not chunk:
                    break
                budget -= len(chunk)
                data, start = pending + chunk, 0
                if self._skipping:
                    newline = data.find(b"\n")
                    if newline < 0:
                        self.offset += len(data)
                        pending = b""
                        continue
                    self.offset += newline + 1
                    start, self._skipping = newline + 1, False
                end = data.rfind(b"\n") + 1
                if end > start:
                    for line in data[start:end - 1].split(b"\n"):
                        self.lines += 1
                        if len(line) > MAX_RECORD_BYTES:
                            self.oversized += 1
                            yield None
                        else:
                            yield line
                    self.offset += end - start
                    start = end
                pending = data[start:]
                if len(pending) > MAX_RECORD_BYTES:  # a line over the bound: skipped to its end, never held
                    self.lines += 1
                    self.oversized += 1
                    self.offset += len(pending)
                    pending, self._skipping = b"", True
                    yield None
            if budget <= 0 and source.read(1):
                self.cut = True


_decoder = json.JSONDecoder(parse_constant=lambda _name: None)  # NaN, Infinity (older logs): None


def parse_record(line: bytes | str | None) -> dict | None:
    """One line of events.jsonl as a record of the shape ``RunLog`` writes (``rank`` and ``seq`` ints, ``kind`` a
    string, ``time`` a finite number or None, ``data`` a dict), or None for a line that is not one."""
    if not line:
        return None
    try:
        record = _decoder.decode(line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line)
    except (ValueError, RecursionError):
        return None
    if type(record) is not dict or type(record.get("rank")) is not int or type(record.get("kind")) is not str:
        return None
    if type(record.get("seq", 0)) is not int:
        return None
    data, when = record.get("data"), record.get("time")
    if data is None:
        record["data"] = {}
    elif type(data) is not dict:
        return None
    if type(when) not in (int, float) or not math.isfinite(when):
        if when is not None and type(when) not in (int, float):
            return None
        record["time"] = None
    return record


def read_run_log(path: str) -> list[dict]:
    """The events of a past run, as written (for reading a run after the fact), read with the bounds of
    ``RunFileLines``; NaN and infinities of older logs read as None. A line that is not a record of the shape
    ``RunLog`` writes is skipped, with a warning that counts them; a file that is not read raises
    ``RunFileRefused`` (a link out of the folder, a FIFO, a device) or ``FileNotFoundError``."""
    lines = RunFileLines(path)
    records, malformed = [], 0
    for line in lines.read():
        record = parse_record(line)
        if record is not None:
            records.append(record)
        elif line is None or line.strip():
            malformed += 1
    if lines.refused:
        raise RunFileRefused(lines.refused)
    if not os.path.lexists(os.path.join(path, "events.jsonl")):
        raise FileNotFoundError(f"{path} has no events.jsonl: not a run log folder")
    if malformed or lines.cut:
        warnings.warn(f"read_run_log({path!r}): {malformed} malformed records skipped"
                      + (f"; only the first {MAX_LOG_BYTES // 2**20} MB read" if lines.cut else ""), stacklevel=2)
    return records


def read_summary(run_dir: str) -> dict:
    """run.json of a run folder, read with bounds (``open_run_file``, ``MAX_SUMMARY_BYTES``); {} when there is
    none yet or it is not a summary."""
    try:
        with open_run_file(run_dir, "run.json") as source:
            raw = source.read(MAX_SUMMARY_BYTES + 1)
    except OSError:
        return {}
    if len(raw) > MAX_SUMMARY_BYTES:
        return {}
    try:
        summary = _decoder.decode(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return {}
    return summary if isinstance(summary, dict) else {}


