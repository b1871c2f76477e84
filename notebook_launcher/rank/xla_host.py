"""The XLA host: the one process the kernel starts for ``device="xla"``, where torch_xla's ``xmp.spawn`` runs
every ordinal, each one a rank of the launch with its own lines, status, result and failure.

Worker side. torch_xla decides how the ordinals run (see ``xla_devices``): a process per TPU chip, or a thread
per device in one process (PJRT's CPU device; TPU v2/v3's two cores per chip). Whichever it is:

- every event an ordinal makes (a print, a log record, ``report()``, its result or exception) goes out on its
  own rank's pipe: ``OrdinalWriters`` is one writer for the whole process whose calls go to the calling
  thread's rank;
- a process that holds one ordinal alone points its fd 1/2 at that rank's pipes, so C/C++ output is the
  rank's; threads of one process share its fd 1/2, which are the lowest rank's;
- the processes torch_xla starts are forks of this one: they inherit the function, its arguments and every
  pipe, so nothing is pickled on the way (a function defined in a notebook works under either start method:
  under spawn this host loaded it from the kernel's cloudpickle payload).
"""

from __future__ import annotations

import importlib
import os
import threading

from ..schema.events import STATUS, EventWriter
from ..schema.proctree import die_with_parent
from ..schema.rank_spec import RankSpec
from .logging import set_thread_rank
from .reporting import call_and_report, report_failure


class OrdinalWriters:
    """An ``EventWriter`` per rank of the host, used as one writer: each call goes to the writer of the calling
    thread's rank (``enter``), or, in a thread that is no ordinal's, to the host's first rank."""

    def __init__(self, spec: RankSpec):
        self.writers = {spec.rank: EventWriter(spec.events_fd, spec.rank)}
        for rank, events_fd, _stdout, _stderr in spec.ordinal_fds:
            self.writers[rank] = EventWriter(events_fd, rank)
        self.first = self.writers[spec.rank]
        self._current = threading.local()

    def enter(self, rank: int) -> EventWriter:
        """From now on, what this thread writes is ``rank``'s."""
        self._current.writer = writer = self.writers[rank]
        return writer

    def _writer(self) -> EventWriter:
        return getattr(self._current, "writer", self.first)

    def emit(self, kind: str, data: dict | None = None, attachment: bytes = b"") -> None:
        self._writer().emit(kind, data, attachment)

    def emit_record(self, values: tuple) -> None:
        self._writer().emit_record(values)

    def emit_text(self, stream: int, text: str) -> None:
        self._writer().emit_text(stream, text)

    def emit_parts(self, kind: str, data: dict, parts: list) -> None:
        self._writer().emit_parts(kind, data, parts)


def run_host(spec: RankSpec, writers: OrdinalWriters, load_function) -> int:
    """Run every ordinal through ``xmp.spawn`` (torch_xla's device count: ``nprocs`` None); the exit code.

    An ordinal reports its own end; an error of torch_xla's own (a process of its pool killed, a runtime that
    cannot start) is reported as the host's, on its first rank."""

    os.environ.update({name: value for name, value in spec.env.items() if name not in ("RANK", "LOCAL_RANK")})
    try:
        function, args = load_function()
        xmp = importlib.import_module("torch_xla.distributed.xla_multiprocessing")
        global _entry
        _entry = _Ordinal(function, tuple(args), writers, spec)
        xmp.spawn(_entry, nprocs=None, start_method="fork")
    except BaseException as exc:  # noqa: BLE001 - every exception must reach the kernel
        report_failure(writers.first, exc, 1, message=f"torch_xla could not run the ordinals: "
                                                      f"{type(exc).__name__}: {exc}")
        return 1
    return 0


class _Ordinal:
    """What ``xmp.spawn`` calls with each ordinal, in whichever process or thread torch_xla runs it."""

    def __init__(self, function, args: tuple, writers: OrdinalWriters, spec: RankSpec):
        self.function = function
        self.args = args
        self.writers = writers
        self.results = spec.results
        self.host_pid = os.getpid()
        self.stdio = {rank: (stdout, stderr) for rank, _events, stdout, stderr in spec.ordinal_fds}
        self._set_up_pid = self.host_pid
        self._lock = threading.Lock()

    def __reduce__(self):
        # torch_xla's process pool pickles what it runs; its processes are forks of this one and have it already
        return _inherited_entry, ()

    def __call__(self, ordinal: int) -> None:
        events = self.writers.enter(ordinal)
        set_thread_rank(ordinal, ordinal)
        self._set_up_process(ordinal)
        events.emit(STATUS, {"state": "starting", "pid": os.getpid(), "local_rank": ordinal,
                             "thread": threading.current_thread().name})
        events.emit(STATUS, {"state": "running"})
        call_and_report(events, lambda: self.function(*self.args), ordinal, self.results)

    def _set_up_process(self, ordinal: int) -> None:
        """Once in each process of torch_xla's pool: it dies with this host; alone with its ordinal, it takes
        that rank's environment and fd 1/2."""
        with self._lock:
            if self._set_up_pid == os.getpid():
                return
            self._set_up_pid = os.getpid()
            if os.getpid() != self.host_pid:
                die_with_parent(self.host_pid)
            import torch_xla.runtime as xr

            if xr.addressable_device_count() == 1:
                os.environ.update({"RANK": str(ordinal), "LOCAL_RANK": str(ordinal)})
                if ordinal in self.stdio:
                    for source, target in zip(self.stdio[ordinal], (1, 2)):
                        os.dup2(source, target)


_entry: _Ordinal | None = None


def _inherited_entry() -> _Ordinal:
    return _entry
