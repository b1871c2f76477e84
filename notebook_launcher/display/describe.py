"""How each kind of event reads as text, in one table, so a kind says the same thing wherever it is shown.

The text display, the panel's lines and its plain/HTML fallback, and the inspector's rows all read an event
through ``describe(kind, data, rank)``. A ``Description`` holds both forms a kind has: the inspector's row
(``kind``, ``level``, ``text`` and a folded ``detail``) and ``said``, the lines the live displays print for
it while the run goes on (without the rank prefix; none for the kinds the panel shows in other ways, such as
status changes and progress reports).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from ..schema.events import (
    AGENT_EVENT,
    BALANCE,
    BATCH_SIZE,
    DISPLAY,
    EXIT,
    FAILURE,
    HANG_NOTICE,
    LAUNCHER,
    LOG,
    NODE_ERROR_EVENT,
    NOTE_EVENT,
    OOM_RETRY,
    OUTPUT,
    PROGRESS,
    RESTART,
    RESULT,
    SHAPE_MISMATCH,
    STATUS,
    STREAM,
    TEXT_ESCAPED,
    TRIGGER,
)

MAX_DATA_CHARS = 2000  # an unknown kind's data, as JSON, is cut here (the run log has it all)
LAUNCHER_KINDS = (LAUNCHER, OOM_RETRY, RESTART, HANG_NOTICE, TEXT_ESCAPED)  # the launcher's own lines: no rank prefix
STDERR_KINDS = ("stderr", FAILURE, EXIT)  # descriptions whose lines go to stderr: a rank's stderr, failures, kills


class Description(NamedTuple):
    """One event as text."""

    kind: str  # "stdout" / "stderr" for output lines, else the event's kind
    level: str  # log records: the level name; "" otherwise
    levelno: int  # log records: the level number; 0 otherwise
    text: str  # the inspector's row: one line for everything but output, whose lines can be long
    detail: str  # more, shown folded: a traceback, a log record's exception text and stack; "" if none
    said: tuple[str, ...] = ()  # the lines the text display prints (the panel keeps) for it; () for none


_new = tuple.__new__  # for the two kinds of every line a rank prints: a Description without NamedTuple's __new__


def describe(kind: str, data: dict, rank: int | None = None) -> Description | None:
    """The event as text, or None for a record that says nothing to a reader (a log placeholder). Data of any
    shape reads as something (a run log read back may hold anything): a field of the wrong type is shown as it
    is, and a kind's data its reader cannot read is shown as its data, like a kind of a newer version."""
    if not isinstance(data, dict):
        data = {"data": data}
    reader = _KINDS.get(kind) if isinstance(kind, str) else None
    if reader is not None:
        try:
            return reader(data, rank)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError):
            pass
    # a kind of a newer version, or a multi-host record: its data as it is
    shown = {str(key): value for key, value in data.items() if key != "worker_seq"}
    try:
        text = json.dumps(shown, default=str)[:MAX_DATA_CHARS]
    except (ValueError, RecursionError):
        text = repr(shown)[:MAX_DATA_CHARS]
    return Description(str(kind), "", 0, text, "")


def stream_name(data: dict) -> str:
    """The stream of an output event: "stdout" or "stderr" (anything else reads as stdout)."""
    stream = data.get("stream")
    return stream if stream == "stderr" else "stdout"


def first_line(text: Any) -> str:
    return str(text or "").split("\n", 1)[0]


def log_text(logger: Any, message: Any) -> str:
    """A log record as the inspector's row shows it (the level has a column of its own)."""
    return f"{logger}: {message}"


def log_line(level: Any, logger: Any, message: Any) -> str:
    """A log record as the text display and the panel's fallback show it: ``WARNING train: loss is nan``."""
    return f"{level} {log_text(logger, message)}"


def launcher_line(text: Any) -> str:
    """A line of the launcher itself (a note, a restart): ``notebook_launcher: ...``."""
    return f"notebook_launcher: {text}"


def number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# -- one reader per kind ---------------------------------------------------------------------------------------


def _stream(data: dict, rank: int | None) -> Description:
    text = str(data.get("text", ""))
    said = () if data.get("stack_dump") else (text,)  # (a dump the kernel asked for: shown cleaned elsewhere)
    return _new(Description, (stream_name(data), "", 0, text, "", said))


def _output(data: dict, rank: int | None) -> Description:
    """A piece of text as the worker wrote it: the live displays get its lines as ``stream`` events."""
    return Description(stream_name(data), "", 0, str(data.get("text", "")), "")


def _log(data: dict, rank: int | None) -> Description | None:
    if "message" not in data:
        return None  # an in_order placeholder: the rank's level filtered its record out
    level = str(data.get("level") or "")
    levelno = data.get("levelno")
    if not isinstance(levelno, int):
        levelno = logging.getLevelName(level) if isinstance(logging.getLevelName(level), int) else 0
    extras = [str(extra) for extra in (data.get("exc_text"), data.get("stack")) if extra]
    said = log_line(level, data.get("logger"), data["message"]).rstrip("\n").splitlines()
    for extra in extras:
        said += extra.splitlines()
    return _new(Description, (LOG, level, levelno, log_text(data.get("logger"), data["message"]),
                              "\n".join(extras), tuple(said)))


def _failure(data: dict, rank: int | None) -> Description:
    message = str(data.get("message") or "")
    head = f"{data.get('type')}: {first_line(message)}" if message else str(data.get("type"))
    detail = str(data.get("traceback") or "") or (message if "\n" in message else "")
    return Description(FAILURE, "", 0, head, detail, (f"failed: {head}",))


def _exit(data: dict, rank: int | None) -> Description:
    stopped = bool(data.get("stopped_by_launcher"))
    text = f"killed by {data['signal_name']}" if data.get("signal_name") else f"exit code {data.get('exit_code')}"
    said = (text,) if data.get("signal_name") and not stopped else ()  # a rank the launcher stopped is no news
    return Description(EXIT, "", 0, text + (" (stopped by the launcher)" if stopped else ""), "", said)


def _status(data: dict, rank: int | None) -> Description:
    extras = [f"{key.replace('_', ' ')} {data[key]}" for key in ("pid", "local_rank", "exit_code")
              if data.get(key) is not None]
    return Description(STATUS, "", 0, str(data.get("state")) + (f" ({', '.join(extras)})" if extras else ""), "")


def _result(data: dict, rank: int | None) -> Description:
    if data.get("kept") is False:
        return Description(RESULT, "", 0, f"returned a {data.get('type')}, not sent: {data.get('reason')}", "")
    return Description(RESULT, "", 0, f"returned a {data.get('type')} ({data.get('bytes')} bytes)", "")


def _launcher(data: dict, rank: int | None) -> Description:
    text = str(data.get("text", ""))
    return Description(LAUNCHER, "", 0, text, "", (launcher_line(text),))


def _progress(data: dict, rank: int | None) -> Description:
    total = data.get("total")
    metrics = data.get("metrics") or {}
    parts = [f"step {data.get('step')}" + (f"/{total}" if total is not None else "")]
    if isinstance(metrics, dict):
        parts += [f"{name}={number(value)}" for name, value in metrics.items()]
    return Description(PROGRESS, "", 0, "  ".join(parts), "")


def _balance(data: dict, rank: int | None) -> Description:
    elapsed, waited = data.get("elapsed"), data.get("waited")
    parts = []
    if isinstance(elapsed, (int, float)) and isinstance(waited, (int, float)) and elapsed > 0:
        parts.append(f"waited {waited / elapsed:.0%} of {elapsed:.1f} s in collectives")
    cuda = data.get("cuda") if isinstance(data.get("cuda"), dict) else {}
    peak = cuda.get("peak_allocated") or data.get("peak_rss")
    if isinstance(peak, (int, float)):
        parts.append(f"peak memory {peak / 1e6:.0f} MB" + (" (GPU)" if cuda.get("peak_allocated") else ""))
    final = " (at the end)" if data.get("final") is True else ""
    return Description(BALANCE, "", 0, ", ".join(parts) + final or "balance figures", "")


def _shape_mismatch(data: dict, rank: int | None) -> Description:
    message = str(data.get("message") or "")
    return Description(SHAPE_MISMATCH, "", 0, first_line(message) or f"ranks disagree on {data.get('operation')}",
                       message if "\n" in message else "")


def _trigger(data: dict, rank: int | None) -> Description:
    text = f"set_trigger() at {data.get('call_site')}"
    return Description(TRIGGER, "", 0, text, "", (f"{text}: the next check_trigger() returns True on every rank",))


def _batch_size(data: dict, rank: int | None) -> Description:
    return Description(BATCH_SIZE, "", 0, f"{data.get('key')}: trying batch size {data.get('batch_size')}", "")


def _oom_retry(data: dict, rank: int | None) -> Description:
    ranks = data.get("ranks") if isinstance(data.get("ranks"), list) else None
    ranks = ", ".join(str(each) for each in ranks or ([] if rank is None else [rank]))
    text = (f"rank {ranks} ran out of memory at batch size {data.get('batch_size')} ({first_line(data.get('error'))}"
            f"); restarting all ranks at batch size {data.get('new_batch_size')}")
    return Description(OOM_RETRY, "", 0, text, "", (launcher_line(text),))


def _restart(data: dict, rank: int | None) -> Description:
    """A new attempt. After an out-of-memory error the ``oom_retry`` line has said it already."""
    text = str(data.get("text", ""))
    return Description(RESTART, "", 0, text, "",
                       () if data.get("reason") == "out of memory" else (launcher_line(text),))


def _hang_notice(data: dict, rank: int | None) -> Description:
    """The stall watchdog's notice: its block of text as it is (the first line is the row)."""
    text = str(data.get("text") or "")
    lines = tuple(text.splitlines())
    return Description(HANG_NOTICE, "", 0, first_line(text), text if len(lines) > 1 else "", lines)


def _display(data: dict, rank: int | None) -> Description:
    """A rank's display (``rank/rich_output.py``): its text/plain's first line, or its MIME types; an update or a
    clear says nothing live (the display itself is one line)."""
    op = data.get("op")
    if op == "clear":
        waits = " (at its next display)" if data.get("wait") else ""
        return Description(DISPLAY, "", 0, f"cleared its output{waits}", "")
    bundle = data.get("data") if isinstance(data.get("data"), dict) else {}
    text = bundle.get("text/plain")
    shown = first_line(text) if isinstance(text, str) and text.strip() else f"<{', '.join(map(str, bundle))}>"
    if data.get("omitted"):
        shown += f" (without {', '.join(map(str, data['omitted']))})"
    if op == "update":
        return Description(DISPLAY, "", 0, f"updated display {data.get('display_id')}: {shown}", "")
    return Description(DISPLAY, "", 0, shown, "", (shown,))


def _text_escaped(data: dict, rank: int | None) -> Description:
    """A rank escaped lone surrogates in its text (``events.wire_text``); the displays say it once per run."""
    text = (f"text of rank {rank} ({data.get('route')}) held lone surrogates such as \\ud800, which UTF-8 cannot "
            "carry: each is shown as its backslash escape, in every rank's text")
    return Description(TEXT_ESCAPED, "", 0, text, "", (launcher_line(text),))


# every kind of ``kinds.KINDS`` (tests/test_event_kinds.py checks it); None: read as its data, as it is
_KINDS: dict[str, Callable[[dict, Any], Description | None] | None] = {
    STREAM: _stream, OUTPUT: _output, LOG: _log, FAILURE: _failure, EXIT: _exit, STATUS: _status, RESULT: _result,
    LAUNCHER: _launcher, PROGRESS: _progress, BALANCE: _balance, SHAPE_MISMATCH: _shape_mismatch, TRIGGER: _trigger,
    BATCH_SIZE: _batch_size, OOM_RETRY: _oom_retry, RESTART: _restart, HANG_NOTICE: _hang_notice,
    DISPLAY: _display, TEXT_ESCAPED: _text_escaped, AGENT_EVENT: None, NOTE_EVENT: None, NODE_ERROR_EVENT: None,
}
