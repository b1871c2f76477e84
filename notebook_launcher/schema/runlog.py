"""The run log on disk: one private folder per run (every event as JSON lines, and a summary), pruned."""

from __future__ import annotations

import json
import os
import re
import shutil
import time

from .events import LOG, RECORD_KEYS, Event
from .lines import LogRecords, StreamLines

RUNS_DIR_ENV_VAR = "NOTEBOOK_LAUNCHER_RUNS_DIR"
RUN_ID = re.compile(r"\d{8}-\d{6}-\d+-[0-9a-f]{6}")
KEEP_RUNS = 50
# json's own C encoder, called directly (json.dumps makes a new encoder at every call): compact separators
_markers: dict = {}  # (what json.dumps checks circular references with; emptied after a failed line)
_encode = json.encoder.c_make_encoder(_markers, str, json.encoder.encode_basestring_ascii, None, ":", ",", False,
                                      False, True) if json.encoder.c_make_encoder else json.JSONEncoder(
    default=str, separators=(",", ":")).iterencode
_string = json.encoder.encode_basestring_ascii
_STREAMS = {"stdout": '"stdout"', "stderr": '"stderr"'}


def runs_root() -> str:
    """Where run logs live: $NOTEBOOK_LAUNCHER_RUNS_DIR, else the user's cache directory."""
    explicit = os.environ.get(RUNS_DIR_ENV_VAR)
    if explicit:
        return explicit
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "notebook_launcher", "runs")


class RunLog:
    """One private directory per run: ``events.jsonl`` (every event, as it arrives) and ``run.json`` (summary).

    Only the newest ``KEEP_RUNS`` finished run directories are kept (see ``_prune``).
    """

    _FLUSH_EVERY_S = 0.5

    def __init__(self, root: str | None = None):
        root = root or runs_root()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.run_id = f"{stamp}-{os.getpid()}-{os.urandom(3).hex()}"
        self.path = os.path.join(root, self.run_id)
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
            os.mkdir(self.path, mode=0o700)
            self._events = open(os.path.join(self.path, "events.jsonl"), "w", encoding="utf-8")
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write the run log in {root} ({exc.strerror or exc}): set "
                          f"{RUNS_DIR_ENV_VAR} to a folder you can write to") from exc
        self._last_flush = time.monotonic()
        _prune(root, keep=KEEP_RUNS, current=self.run_id)

    def write(self, event: Event) -> None:
        self._events.write(_line(event))
        self._flush_now_and_then()

    def write_lines(self, lines: list) -> None:
        """``write`` for plain lines read together (``RankDemux``): one write for all. The lines of a run, whose
        shape the kernel made or checked itself, are written field by field, without the JSON encoder's walk."""
        out = []
        for item in lines:
            if type(item) is StreamLines:
                head, tail = (f'{{"rank":{item.rank},"seq":', f',"time":{_number(item.time)},"kind":"stream",'
                              f'"data":{{"stream":{_STREAMS[item.stream]},"text":')
                seq = item.seq
                out += [f'{head}{seq + number}{tail}{_string(text)}}}}}\n' for number, text in enumerate(item.texts)]
            elif type(item) is LogRecords:
                rank, seq = item.rank, item.seq
                out += [_record_line(rank, seq + number, frame) for number, frame in enumerate(item.frames)]
            else:
                out.append(_line(item))
        self._events.write("".join(out))
        self._flush_now_and_then()

    def _flush_now_and_then(self) -> None:
        now = time.monotonic()
        if now - self._last_flush > self._FLUSH_EVERY_S:
            self._events.flush()
            self._last_flush = now

    def write_summary(self, summary: dict) -> None:
        with open(os.path.join(self.path, "run.json"), "w", encoding="utf-8") as out:
            json.dump(summary, out, indent=2, default=str)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        if not self._events.closed:
            self._events.close()


def _line(event: Event) -> str:
    """The line json.dumps(event.to_json()) gives, compact, without making the dict (once per line)."""
    try:
        return (f'{{"rank":{int(event.rank)},"seq":{int(event.seq)},"time":{_number(event.time)},'
                f'"kind":{_string(str(event.kind))},"data":{"".join(_encode(event.data, 0))}'
                + (f',"attachment_bytes":{len(event.attachment)}}}\n' if event.attachment else "}\n"))
    except (TypeError, ValueError):  # data JSON cannot hold as it is (keys that are not strings, from a rank)
        _markers.clear()
        return json.dumps(_plain(event.to_json()), default=str) + "\n"


def _record_line(rank: int, seq: int, frame: tuple) -> str:
    """``_line`` of a get_logger record from its record frame (``LogRecords``: its types checked when it was
    read), written field by field: the JSON encoder's walk was 40% of the kernel's time for a record in a flood."""
    _, when, level, levelno, logger, message, file, line, function, created, worker_seq = frame
    if when - when != 0 or created - created != 0:  # NaN or an infinity: as json writes them
        return _line(Event(rank, seq, when, LOG, dict(zip(RECORD_KEYS, frame[2:]))))
    return (f'{{"rank":{rank},"seq":{seq},"time":{when!r},"kind":"log","data":{{'
            f'"level":{_string(level)},"levelno":{levelno},"logger":{_string(logger)},"message":{_string(message)},'
            f'"file":{_string(file)},"line":{line},"function":{_string(function)},"created":{created!r},'
            f'"worker_seq":{worker_seq}}}}}\n')


def _number(value) -> str:
    value = float(value)
    return repr(value) if value - value == 0 else json.dumps(value)  # NaN and infinities as json writes them


def _plain(value):
    """``value`` with every dict key made a string, so that it can be written as JSON."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def read_run_log(path: str) -> list[dict]:
    """The events of a past run, as written (for reading a run after the fact)."""
    with open(os.path.join(path, "events.jsonl"), encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


PRUNE_MIN_AGE_S = 600  # a run folder younger than this is never pruned (it may belong to a run in progress)


def _prune(root: str, keep: int, current: str = "") -> None:
    """Keep the ``keep`` newest run folders, newest by the time they last changed (not by the stamp in their name,
    which another kernel's time zone or a clock set back can put in the future). Never removed: the current run,
    any folder changed in the last ``PRUNE_MIN_AGE_S`` seconds, and a folder without its summary whose kernel
    (the pid in its name) is still alive on this machine: those may be runs still going on."""
    now = time.time()
    candidates = []
    try:
        entries = os.listdir(root)
    except OSError:
        return
    for entry in entries:  # only our own run directories are ever removed, whatever else lives in that folder
        path = os.path.join(root, entry)
        if entry == current or not RUN_ID.fullmatch(entry):
            continue
        try:
            changed = os.stat(path).st_mtime
        except OSError:
            continue
        if not os.path.isdir(path) or now - changed < PRUNE_MIN_AGE_S or _maybe_in_progress(entry, path):
            continue
        candidates.append((changed, entry))
    candidates.sort()
    for _, old in candidates[:max(0, len(candidates) - keep)]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)


def _maybe_in_progress(run_id: str, path: str) -> bool:
    if os.path.exists(os.path.join(path, "run.json")):
        return False
    pid = int(run_id.split("-")[2])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists (owned by someone else)
    return True
