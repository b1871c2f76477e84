"""Every kind of event, declared once (``KINDS``): its data in words, the table the kernel checks a rank's event
against, and whether and how the panel and its plain-text fallback show it.

The kernel's tables are made from these declarations (``DATA_SCHEMA``, ``KERNEL_ONLY_KINDS``, ``CARD_LISTS``);
the displays' tables, which hold the code (``display/describe.py``'s readers, ``display/state.py``'s handlers,
``display/fallback.py``'s card lines), are checked against them by ``tests/test_event_kinds.py``, which names the
table a new kind is missing from.

``data`` is checked as the kernel reads each event a rank sends (``decoding.check_data``): a field of the wrong
type, a required one missing, NaN or an infinity where a number is expected, a list or dict beyond its bound, a key
that is not a str, or a kind without a table ends that rank's stream as one ``CorruptEventStream`` failure, which
names the kind and the field. Fields a table does not name pass through unread (the run log keeps them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STATUS = "status"
STREAM = "stream"
OUTPUT = "output"
RESULT = "result"
FAILURE = "failure"
EXIT = "exit"
LAUNCHER = "launcher"
SHAPE_MISMATCH = "shape_mismatch"
TRIGGER = "trigger"
BATCH_SIZE = "batch_size"
OOM_RETRY = "oom_retry"
RESTART = "restart"
PROGRESS = "progress"
LOG = "log"
BALANCE = "balance"
DISPLAY = "display"
TEXT_ESCAPED = "text_escaped"
HANG_NOTICE = "hang_notice"
# kinds an agent of a launch across hosts sends besides its ranks' events
AGENT_EVENT = "agent"
NOTE_EVENT = "note"
NODE_ERROR_EVENT = "node_error"

TEXT_STREAMS = ("stdout", "stderr")  # an ``output`` text frame's stream, by its index

NUMBER = "number"  # an int, or a float that is neither NaN nor infinite (never a bool)


@dataclass(frozen=True)
class ListOf:
    """A list (or tuple) of at most ``most`` items, each of ``item``."""

    item: Any
    most: int = 1 << 16


@dataclass(frozen=True)
class MapOf:
    """A dict of at most ``most`` names (str) to values of ``value``."""

    value: Any
    most: int = 1 << 12


@dataclass(frozen=True)
class OneOf:
    """One of these strings."""

    values: tuple


@dataclass(frozen=True)
class Fields:
    """A dict with these fields, each of its type where present; ``required`` must be present. Other fields (with
    str keys) pass through unread: the run log keeps them."""

    types: dict
    required: tuple = ()


# A field's type: str, int or bool (exactly: a bool is not an int), NUMBER, None, ListOf, MapOf, OneOf, Fields,
# or a tuple of types (any of them).

FALLBACK_PLACES = {
    "verdict": "the verdict card at the top (its title, detail, traceback or out-of-memory steps)",
    "rows": "the row per rank (status, step, speed) and the balance line",
    "lines": "among its rank's lines, or the launcher's notes",
    "cards": "its own lines after the ranks' lines (display/fallback.py's CARD_LINES)",
    "": "not shown",
}


@dataclass(frozen=True)
class Kind:
    """One kind of event. ``data``: the table of the data a rank sends (None: only the kernel or an agent makes
    it, and a rank's pipe that carries it is corrupt). ``panel``: the panel folds it into its state
    (``display/state.py`` has a handler). ``cards``: the key of the panel state's bounded list of its cards, cut
    first when the saved output is over its budget (``display/budget.py``). ``fallback``: where the plain-text
    and HTML fallback shows it (``FALLBACK_PLACES``)."""

    name: str
    doc: str
    data: Fields | None = None
    panel: bool = False
    cards: str = ""
    fallback: str = ""


OOM_REPORT = Fields({"key": str, "batch_size": int, "new_batch_size": int, "error": str,
                     "memory": MapOf(NUMBER)}, required=("key", "batch_size", "new_batch_size"))

KINDS = (
    Kind(STATUS, '{"state": "starting" | "running" | "finished" | "failed"}, with ``pid`` and ``local_rank`` when '
         "starting and ``exit_code`` when finished or failed",
         Fields({"state": OneOf(("starting", "running", "finished", "failed")), "pid": int, "local_rank": int,
                 "exit_code": (int, None), "host": str, "thread": str}, required=("state",)),
         panel=True, fallback="rows"),
    Kind(STREAM, '{"stream": "stdout" | "stderr", "text": <one line without its newline>} (made by the kernel: '
         "from ``output`` events, and from the worker's fd 1/2 pipes, so C/C++ output arrives too); with "
         '``"redraw": True`` it is the newest state of a line still being redrawn with ``\\r`` (a tqdm bar)',
         panel=True, fallback="lines"),
    Kind(OUTPUT, '{"stream", "text"}: a piece of text the worker\'s Python code wrote to sys.stdout/stderr (on '
         "the event channel, so it keeps its order with log records; the kernel cuts it into ``stream`` lines). "
         "Sent as a text frame (``events.EventWriter.emit_text``)",
         Fields({"stream": OneOf(TEXT_STREAMS), "text": str}, required=("text",))),
    Kind(RESULT, '{"type": <type name>, "bytes": <size>, "attachment_bytes", "pickle_bytes", "storages": [sizes]}; '
         "attachment: the pickle, then the raw bytes of each tensor storage (``results.py``); or, for a value not "
         'sent, {"type", "kept": False, "reason"} and no attachment (the panel shows it when the run ends); with '
         '"in_memory": True (and no "attachment_bytes") the same bytes are in the kernel\'s in-memory file for the '
         'rank (``result_memory.py``) and there is no attachment, "phases" placing storages in it; "memory_failed": '
         "why they are not",
         Fields({"type": str, "bytes": int, "attachment_bytes": int, "pickle_bytes": int,
                 "storages": ListOf(int, 1 << 24), "kept": bool, "reason": str, "in_memory": bool,
                 "phases": ListOf(int, 1 << 24), "memory_failed": str}, required=("type",))),
    Kind(FAILURE, '{"type", "module", "message", "traceback", "exit_code"}: the exception that ended the worker '
         "(the kernel also makes ``TruncatedEvent`` and ``CorruptEventStream`` failures); a rank's out-of-memory "
         "report travels as its ``oom_retry`` field",
         Fields({"type": str, "module": (str, None), "message": str, "traceback": str, "exit_code": (int, None),
                 "all_ranks_raise": bool, "oom_retry": (OOM_REPORT, None)}, required=("type", "message")),
         panel=True, fallback="verdict"),
    Kind(EXIT, '{"exit_code", "signal", "signal_name", "stopped_by_launcher"} (made by the kernel when it reaps '
         "the worker; a negative exit code is the signal that killed it)",
         panel=True, fallback="rows"),
    Kind(LAUNCHER, '{"text": ...}: a note from the launcher itself (restarts, teardown)',
         panel=True, fallback="lines"),
    Kind(SHAPE_MISMATCH, '{"operation", "operations", "shapes", "dtypes", "call_sites", "message"}: debug mode '
         "found ranks disagreeing on a collective (sent once, by rank 0; every rank then raises)",
         Fields({"operation": (str, None), "operations": ListOf((str, None)),
                 "shapes": ListOf((ListOf(int, 64), None)), "dtypes": ListOf((str, None)),
                 "call_sites": ListOf((str, None)), "message": str}, required=("message",)),
         panel=True, cards="shape_mismatches", fallback="cards"),
    Kind(TRIGGER, '{"call_site"}: this rank called set_trigger()',
         Fields({"call_site": (str, None)}),
         panel=True, cards="triggers", fallback="cards"),
    Kind(BATCH_SIZE, '{"key", "batch_size"}: find_executable_batch_size starts a try at this size',
         Fields({"key": str, "batch_size": int}, required=("key", "batch_size")),
         panel=True, fallback="verdict"),
    Kind(OOM_RETRY, '{"key", "ranks", "batch_size", "new_batch_size", "error", "memory"} (made by the kernel): '
         "rank(s) ran out of memory; every rank restarts at the new size",
         panel=True, cards="oom_retries", fallback="verdict"),
    Kind(RESTART, '{"attempt", "reason": "out of memory" | "failure", "batch_size", "text"} (made by the '
         "kernel): every rank starts again, as attempt ``attempt``",
         panel=True, fallback="lines"),
    Kind(PROGRESS, '{"step", "total", "metrics": {name: number}}: ``report(step=..., **metrics)``',
         Fields({"step": (int, None), "total": (int, None), "metrics": MapOf((NUMBER, str))}),
         panel=True, fallback="rows"),
    Kind(LOG, '{"level", "levelno", "logger", "message", "file", "line", "function", "created"}, and '
         '"exc_text", "stack", "in_order" when the record has them: one logging record (``get_logger``, plain '
         "``logging``, ``warnings.warn``). ``in_order`` is the rank's count of in_order calls; a record "
         '{"in_order": n, "skipped": True} says the rank\'s level filtered its record of call n out. A '
         "``get_logger`` record of the usual shape travels as a record frame (``events.EventWriter.emit_record``)",
         # (a record of another shape than get_logger's: logging leaves funcName, lineno and the like None at times)
         Fields({"level": (str, None), "levelno": (int, None), "logger": (str, None), "message": str,
                 "file": (str, None), "line": (int, None), "function": (str, None), "created": (NUMBER, None),
                 "exc_text": (str, None), "stack": (str, None), "in_order": int, "skipped": bool}),
         panel=True, fallback="lines"),
    Kind(BALANCE, '{"elapsed", "waited", "steps": [[step, seconds since start, seconds waited so far] (+ for '
         "DDP's steps: the step's wait in its backward, null where not sampled)], \"step_source\": \"ddp\" | "
         '"report" | None, "final", "peak_rss", "cuda": {"peak_allocated", "peak_reserved", "total"} | None}: '
         "the rank's time in collectives and its memory, a few times a minute and at the function's end "
         "(``rank/balance_meter.py``; read by ``balance.py``)",
         Fields({"elapsed": NUMBER, "waited": NUMBER, "steps": ListOf(ListOf((NUMBER, None), 4), 1 << 20),
                 "step_source": (str, None), "final": bool, "peak_rss": (NUMBER, None),
                 "cuda": (Fields({"peak_allocated": NUMBER, "peak_reserved": NUMBER, "total": NUMBER}), None)},
                required=("elapsed", "waited")),
         panel=True, fallback="rows"),
    Kind(DISPLAY, '{"op": "display" | "update" | "clear", "data": {mime: str | dict | list}, "metadata": {...}, '
         '"display_id": str | None, "wait": bool, "omitted": [mime types], "bytes": int}: what IPython would have '
         "published from the rank, as Jupyter's wire form (binary data base64); ``omitted``: MIME types the rank "
         "left out (over ``rich_output.MAX_BUNDLE_BYTES``, over its budget for the run, or a widget view), "
         "``bytes`` the bundle's size before that (``rank/rich_output.py``; shown by ``display/rich.py``)",
         # (the bundle and its metadata: dicts whose names are str all the way down, read by display/rich.py)
         Fields({"op": OneOf(("display", "update", "clear")), "display_id": (str, None), "wait": bool,
                 "omitted": ListOf(str, 64), "bytes": int}, required=("op",)),
         panel=True, fallback="lines"),
    Kind(TEXT_ESCAPED, '{"route": <the kind of the event>}: text this rank sent held lone surrogates, which no '
         "UTF-8 can carry: the writer sent each as its backslash escape, and says so once per process (the "
         "panel's notes and the text display say it once per run)",
         Fields({"route": str}),
         panel=True, fallback="lines"),
    Kind(HANG_NOTICE, '{"state": "open", "quiet_s", "ranks": {rank: {"state": "waiting" | "in_ddp" | "busy" | '
         '"finished" | "exited", "text", "waited"}}, "diverged": rank | None, "stacks": {rank: text}, "text", '
         '"verdict", "timeout", "timeout_in"} or {"state": "cleared", "quiet_s", "text"} (made by the kernel, '
         "rank -1): the stall watchdog saw no rank make progress for ``hang_warning`` seconds while one waits in "
         "a collective (``supervision/hangs.py``); earlier notices are kept as cards",
         panel=True, cards="hangs", fallback="verdict"),
    Kind(AGENT_EVENT, '{"master_port": p} from node 0\'s agent, {"done": exit_code} at its end (an agent of a launch '
         "across hosts, read by ``cluster/coordinator.py``)"),
    Kind(NOTE_EVENT, '{"text"}: a line of an agent\'s own launcher (the launching kernel shows it as its own note)'),
    Kind(NODE_ERROR_EVENT, '{"type", "message", "traceback"}: the launch on that host ended so'),
)

BY_NAME = {kind.name: kind for kind in KINDS}
# every kind a rank's pipe may carry has its table; any other is refused
DATA_SCHEMA = {kind.name: kind.data for kind in KINDS if kind.data is not None}
KERNEL_ONLY_KINDS = tuple(kind.name for kind in KINDS if kind.data is None)  # never on a rank's own event pipe
CARD_LISTS = tuple(kind.cards for kind in KINDS if kind.cards)  # the panel state's lists of cards
