"""Rank-aware logging: ``get_logger`` with ``main_process_only`` and ``in_order``, as in Accelerate.

Inside a launched worker every record travels to the kernel as a structured ``log`` event (rank, level, logger,
message, the caller's file:line and function, exception text) and shows in the cell as
``[rank 1] DEBUG mymodule: message``. ``in_order=True`` records are put in rank order by the kernel: the workers
never wait on each other (no barrier, so ranks with different levels cannot deadlock). Outside a launch (in the
kernel, in a script, under torchrun) the adapter logs through the standard handlers, with the rank taken from
the environment.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Mapping

from ..schema.events import LOG, RECORD_KEYS, RECORD_TYPES, EventWriter
from . import context

_in_order_calls = 0
_in_order_lock = threading.Lock()
_root = logging.getLogger()
_root_handlers: list = []  # [the event handler] once install_event_logging has run (the fast path's test)


class MultiProcessAdapter(logging.LoggerAdapter):
    """A logger for the rank it runs on. Every logging method takes two more keywords:

    - ``main_process_only`` (default True): log only on the global main process (rank 0);
    - ``in_order`` (default False): with ``main_process_only=False``, the records of this call show rank 0,
      rank 1, ... in that order, every time.

    ``local_main_process_only=True`` logs once per node (local rank 0) instead.
    """

    def log(self, level, msg, *args, main_process_only=True, in_order=False, local_main_process_only=False,
            stacklevel=1, **kwargs):
        if isinstance(level, str):
            level = logging.getLevelName(level.upper())
        order = _next_in_order_id() if in_order and not main_process_only else None
        channel = context.current.writer  # a launched rank's: records go to the kernel as events
        skip = (local_main_process_only and _env_int("LOCAL_RANK") != 0) or (
            main_process_only and not local_main_process_only and _env_int("RANK") != 0)
        if skip or not self.logger.isEnabledFor(level):
            if order is not None and channel is not None:
                channel.emit(LOG, {"in_order": order, "skipped": True})  # the kernel need not wait for us
            return
        if not kwargs and channel is not None and _FAST_CALLER and type(level) is int \
                and type(self) is MultiProcessAdapter and _only_event_handler(self.logger):
            try:
                values = _record_values(self.logger, level, msg, args, stacklevel)
                if order is None and type(values[0]) is type(values[2]) is str and type(values[5]) is int:
                    channel.emit_record(values)  # (RECORD_TYPES: a custom level's name or a logger's may not be)
                    return
                data = dict(zip(RECORD_KEYS, values))
                if order is not None:
                    data["in_order"] = order
                channel.emit(LOG, data)
                return
            except Exception:  # noqa: BLE001 - a message that does not format: logging's own path reports it
                pass
        extra = kwargs.pop("extra", None)
        msg, kwargs = self.process(msg, kwargs)
        if extra or order is not None:
            kwargs["extra"] = {**(kwargs.get("extra") or {}), **(extra or {}), "nl_in_order": order}
        self.logger.log(level, msg, *args, stacklevel=stacklevel + 1, **kwargs)

    def __getstate__(self) -> dict:
        """A copy or a pickle leaves out the level methods kept (they are bound to this adapter)."""
        return {key: value for key, value in self.__dict__.items() if key not in _LEVEL_METHODS}

    @functools.lru_cache(None)  # noqa: B019 - once per distinct message, for the life of the process
    def warning_once(self, *args, **kwargs):
        """``warning`` that emits a given message only once (per process), like Accelerate's."""
        self.log(logging.WARNING, *args, stacklevel=2, **kwargs)


class _LevelMethod:
    """``logger.info(...)`` and the other level methods: ``log`` at that level, called straight (LoggerAdapter's own
    method is a Python frame in between, a sixth of a record's cost). A subclass's ``log`` is the one called. The
    partial is kept on the adapter at its first use (making it at every call was 6% of a record's cost)."""

    def __init__(self, name: str):
        self.name, self.level = name, getattr(logging, name.upper())
        self.__doc__ = f"``log`` at level {name.upper()}: the same arguments and keywords."

    def __get__(self, adapter, owner=None):
        if adapter is None:
            return self
        method = adapter.__dict__[self.name] = functools.partial(adapter.log, self.level)
        return method


_LEVEL_METHODS = ("debug", "info", "warning", "error", "critical")
for _level in _LEVEL_METHODS:
    setattr(MultiProcessAdapter, _level, _LevelMethod(_level))


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """A rank-aware logger (``logging.LoggerAdapter``) for ``name``.

    The level is ``log_level``, else the environment variable ``ACCELERATE_LOG_LEVEL`` (read now, so setting it
    in the notebook before a launch works), else logging's default. Only this logger's level is set: the root
    logger and other libraries' loggers are left alone. ``logger.setLevel(...)`` works as usual.

    Example::

        logger = get_logger(__name__, log_level="DEBUG")
        logger.info("on the main process only")
        logger.debug("every rank", main_process_only=False)
        logger.debug("every rank, rank 0 first", main_process_only=False, in_order=True)
    """
    source = "log_level"
    if log_level is None:
        log_level = os.environ.get("ACCELERATE_LOG_LEVEL") or None
        source = "the environment variable ACCELERATE_LOG_LEVEL"
    logger = logging.getLogger(name)
    if log_level is not None:
        try:
            logger.setLevel(log_level.upper() if isinstance(log_level, str) else log_level)
        except (ValueError, TypeError):
            raise ValueError(f"{source} is {log_level!r}, which is not a logging level: use DEBUG, INFO, WARNING, "
                             "ERROR or CRITICAL") from None
    return MultiProcessAdapter(logger, {})


class EventLogHandler(logging.Handler):
    """Worker side: each record becomes one ``log`` event on the rank's channel (one write, no thread)."""

    def __init__(self, channel: EventWriter):
        super().__init__()
        self.channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            exc_text = None
            if record.exc_info:
                exc_text = logging.Formatter().formatException(record.exc_info)
            elif record.exc_text:
                exc_text = record.exc_text
            values = (record.levelname, record.levelno, record.name, record.getMessage(), record.pathname,
                      record.lineno, record.funcName, record.created)
            extras = (("exc_text", exc_text), ("stack", record.stack_info),
                      ("in_order", getattr(record, "nl_in_order", None)))
            if all(value is None for _, value in extras) and tuple(map(type, values)) == RECORD_TYPES[:8]:
                self.channel.emit_record(values)  # (the usual record: a record frame, as get_logger's fast path)
                return
            data = dict(zip(RECORD_KEYS, values))
            for key, value in extras:
                if value is not None:  # (left out when empty: every line of a flood is shorter to send and store)
                    data[key] = value
            self.channel.emit(LOG, data)
        except Exception:  # noqa: BLE001 - logging must never take the training down
            self.handleError(record)


def _only_event_handler(logger: logging.Logger) -> bool:
    """Whether a record of ``logger`` would reach our event handler and nothing else: then the call can send
    the event itself, without a LogRecord, the handler lock and the filters (half the cost of a call). Checked
    at every call: the user may add a handler or a filter at any time."""
    if type(logger) is not logging.Logger or logging._logRecordFactory is not logging.LogRecord \
            or logging._srcfile is None:
        return False
    while logger is not _root:
        if logger.handlers or logger.filters or not logger.propagate:
            return False
        logger = logger.parent
        if logger is None:
            return False
    if _root.handlers != _root_handlers or _root.filters:
        return False
    handler = _root_handlers[0]
    return not handler.filters and handler.level == logging.NOTSET and type(handler) is EventLogHandler


# _record_values finds the caller as Python 3.11's Logger.findCaller does (3.10's counts stacklevel otherwise):
# on older Pythons every record takes logging's own path
_FAST_CALLER = sys.version_info >= (3, 11)


def _record_values(logger: logging.Logger, level: int, msg, args, stacklevel: int) -> tuple:
    """The values of what ``EventLogHandler.emit`` sends for a record of this call (``RECORD_KEYS``' first
    eight), made without the record: the same message (``LogRecord.getMessage``) and the same caller
    (``Logger.findCaller``: logging's own frames skipped, ``stacklevel`` frames up from the caller of ``log``)."""
    if args and len(args) == 1 and isinstance(args[0], Mapping) and args[0]:
        args = args[0]
    message = str(msg)
    if args:
        message = message % args
    frame = sys._getframe(2)  # the caller of log() (log's own frame is ours, the one below it is this one)
    srcfile = logging._srcfile
    while frame.f_back is not None:
        name = frame.f_code.co_filename
        if name != srcfile and not ("importlib" in name and "_bootstrap" in name):  # findCaller's test (POSIX)
            if stacklevel <= 1:
                break
            stacklevel -= 1
        frame = frame.f_back
    code = frame.f_code
    return (logging.getLevelName(level), level, logger.name, message, code.co_filename, frame.f_lineno, code.co_name,
            time.time())


def install_event_logging(kernel_streams) -> None:
    """In a worker: send every record (and ``warnings.warn``) to the kernel as events (``context.current``'s
    writer).

    Handlers the notebook attached to the root logger that wrote to the kernel's own stdout/stderr are replaced
    by the event handler (they would print each record a second time).
    """
    global _in_order_calls
    channel = context.current.writer
    _in_order_calls = 0  # a forked worker inherits the kernel's count; every rank starts from the same place
    root = logging.getLogger()
    stream_ids = {id(stream) for stream in kernel_streams}
    for handler in list(root.handlers):
        if isinstance(handler, logging.StreamHandler) and id(getattr(handler, "stream", None)) in stream_ids:
            root.removeHandler(handler)
    handler = EventLogHandler(channel)
    root.addHandler(handler)
    _root_handlers[:] = [handler]
    warnings.showwarning = _warning_to_log


def _warning_to_log(message, category, filename, lineno, file=None, line=None):
    """``warnings.warn`` in a worker: a WARNING record of logger ``py.warnings`` (as logging.captureWarnings
    makes), but carrying the warning's own file and line rather than those of the warnings module."""
    logger = logging.getLogger("py.warnings")
    text = f"{filename}:{lineno}: {category.__name__}: {message}"
    logger.handle(logger.makeRecord(logger.name, logging.WARNING, filename, lineno, text, None, None))


def _next_in_order_id() -> int:
    global _in_order_calls
    with _in_order_lock:
        _in_order_calls += 1
        return _in_order_calls


def set_thread_rank(rank: int, local_rank: int) -> None:
    """The rank of the calling thread, where several ranks share a process (XLA ordinals run as threads):
    ``main_process_only`` then asks the thread, not the process's environment."""
    _thread_ranks.RANK, _thread_ranks.LOCAL_RANK = rank, local_rank


_thread_ranks = threading.local()


def _env_int(name: str) -> int:
    own = getattr(_thread_ranks, name, None)
    if own is not None:
        return own
    try:
        return int(os.environ.get(name, "0"))
    except ValueError:
        return 0
