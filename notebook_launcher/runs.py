"""The record of each launch (``Run``) and the runs this process has launched (``last_run()``, ``recent_runs()``).

The launchers fill a Run as events arrive; the inspector and the doctor read Runs. Neither of those depends on
the launcher: they depend on this module.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from .balance import Balance, BalanceBook
from .errors import RunNotFoundError
from .schema.lines import EventList
from .schema.runlog import RUN_ID, runs_root
from .schema.status import RunStatus
from .supervision.failure import RankFailure

KEEP_IN_MEMORY = 20
MAX_RECENT_BYTES = 256 * 2**20  # the events the earlier runs keep in memory, together (Run.events.bytes)
_recent_runs: list = []


@dataclasses.dataclass
class Run:
    """Everything about one launch, kept after it returns or raises (see ``last_run()``).

    ``results`` and ``exit_codes`` are by global rank; ``events`` holds what every rank said, up to the
    in-memory bound (``launchers.intake.MAX_BYTES_IN_MEMORY``; an earlier run's events go first when the runs
    kept hold more than ``MAX_RECENT_BYTES``): ``events_dropped`` and ``events_dropped_bytes`` say what it left
    out. The run log in ``run_dir`` holds every event.
    """

    run_id: str
    run_dir: str
    device: str
    backend: str
    start_method: str
    num_processes: int
    world_size: int
    status: RunStatus = RunStatus.STARTING  # then running, and how it ended (schema.status.RunStatus)
    results: dict = dataclasses.field(default_factory=dict)
    results_left_out: dict = dataclasses.field(default_factory=dict)  # rank -> why its result did not travel
    results_unavailable: dict = dataclasses.field(default_factory=dict)  # rank -> (type, why it could not be rebuilt)
    exit_codes: dict = dataclasses.field(default_factory=dict)
    failures: dict = dataclasses.field(default_factory=dict)
    root_cause: RankFailure | None = None
    events: EventList = dataclasses.field(default_factory=EventList)  # a list; lines kept compact
    events_dropped: int = 0  # events past the in-memory bound (in the run log only)
    events_dropped_bytes: int = 0  # the bytes they would have held in memory
    attempts: int = 0
    batch_sizes: dict = dataclasses.field(default_factory=dict)  # find_executable_batch_size: latest size per function
    oom_retries: list = dataclasses.field(default_factory=list)  # each restart after an out-of-memory error
    stuck_ranks: list = dataclasses.field(default_factory=list)  # a hang or timeout: the ranks that were waiting
    # a hang or timeout: each rank's Python stacks, the user's frames (ours cut, cells named `cell In[N]`; the run log
    # has them whole)
    stacks: dict = dataclasses.field(default_factory=dict)
    panel_state: dict | None = None  # the run panel's final state (labextension/SCHEMA.md), when it was shown
    started_at: float = dataclasses.field(default_factory=time.time)
    duration: float = 0.0
    balance_book: BalanceBook = dataclasses.field(default_factory=BalanceBook, repr=False)

    @property
    def balance(self) -> Balance:
        """Where the time went: the straggler, each rank's share of time waiting in collectives, its median
        step time and peak memory (see ``Balance``; live while the run goes on, every rank's final figures
        once it is over; empty for a run in the kernel or without a process group)."""
        return self.balance_book.balance()

    def result(self, rank: int = 0) -> Any:
        return self.results.get(rank)

    def output(self, rank: int | None = None, stream: str | None = None) -> list[str]:
        """The lines the workers printed (all ranks, or one), in the order received."""
        return [event.data["text"] for event in self.events
                if event.kind == "stream" and not event.data.get("redraw") and (rank is None or event.rank == rank)
                and (stream is None or event.data.get("stream") == stream)]

    def panel(self, **filters) -> Any:
        """An ipywidgets inspector of this run's whole log: filter by rank, level and kind, search, page through
        it (``notebook_launcher.inspect_run`` takes the same filters, and past runs by id or directory)."""
        return inspect_run(self, **filters)

    def summary(self) -> dict:
        return {
            "run_id": self.run_id, "status": self.status, "device": self.device, "backend": self.backend,
            "start_method": self.start_method, "num_processes": self.num_processes, "world_size": self.world_size,
            "attempts": self.attempts, "exit_codes": self.exit_codes, "duration_s": round(self.duration, 4),
            "root_cause": dataclasses.asdict(self.root_cause) if self.root_cause else None,
            "result_types": {rank: type(value).__name__ for rank, value in self.results.items()},
            "balance": self.balance.to_json() if self.balance_book.ranks else None,
        }

    def __repr__(self) -> str:
        return (f"<Run {self.run_id} {self.status}: {self.num_processes} x {self.device}/{self.backend} "
                f"({self.start_method}), {self.duration:.2f} s, log in {self.run_dir}>")


def last_run() -> Run | None:
    """The most recent launch in this process (results by rank, exit codes, events, failures)."""
    return _recent_runs[-1] if _recent_runs else None


def recent_runs(running: bool = False) -> list:
    """The launches of this process, oldest first (the last ``KEEP_IN_MEMORY``). ``running=True``: instead, the
    detached runs of this user on this machine that are going on, newest first (``DetachedRun``s, as ``attach``
    gives them), whichever kernel launched them."""
    if running:
        from .detached import running_runs

        return running_runs()
    return list(_recent_runs)


def forget_all() -> list:
    """Every run of this process, let go of: ``last_run()`` is None until the next launch. (A forked copy of the
    kernel that supervises a detached run starts with none of the kernel's runs; it keeps the list returned, so
    that nothing of the kernel's is finalized in it.)"""
    runs = list(_recent_runs)
    _recent_runs.clear()
    return runs


def remember(run: Run) -> None:
    """A launch has begun: it is ``last_run()`` from now on, even if it fails before any rank starts. The earlier
    runs keep their events in memory while they hold at most ``MAX_RECENT_BYTES`` together; past that the oldest
    let theirs go first (their summary, results and failures stay; the run log has every event)."""
    _recent_runs.append(run)
    del _recent_runs[:-KEEP_IN_MEMORY]
    held = sum(earlier.events.bytes for earlier in _recent_runs[:-1])
    for earlier in _recent_runs[:-1]:
        if held <= MAX_RECENT_BYTES:
            break
        held -= earlier.events.bytes
        release_events(earlier)


def release_events(run: Run) -> None:
    """``run`` keeps none of its events in memory any more (they are counted as left out)."""
    run.events_dropped += len(run.events)
    run.events_dropped_bytes += run.events.bytes
    run.events = EventList()


def run_dirs(root: str) -> list[str]:
    """Run ids under root, newest first: its folders named as RunLog names them (a link is none: the readers
    never follow one out of the runs folder)."""
    try:
        names = [entry for entry in os.listdir(root) if RUN_ID.fullmatch(entry)
                 and not os.path.islink(os.path.join(root, entry)) and os.path.isdir(os.path.join(root, entry))]
    except OSError:
        return []
    return sorted(names, reverse=True)


def _known_runs_note(root: str, limit: int = 5) -> str:
    names = run_dirs(root)
    if not names:
        return f"There is no run log under {root}."
    more = f" (and {len(names) - limit} older)" if len(names) > limit else ""
    return f"Recent runs under {root}, newest first: {', '.join(names[:limit])}{more}."


def resolve_run(run: Any = None) -> tuple[str, Any]:
    """The run directory for ``run`` (a Run or the error a launch raised, a run id or a unique part of one, a run
    directory or its events.jsonl, or None for the last run), and the Run object when there is one."""
    root = runs_root()
    if run is None:
        current = last_run()
        if current is not None:
            return current.run_dir, current
        names = [name for name in run_dirs(root) if os.path.exists(os.path.join(root, name, "events.jsonl"))]
        if names:  # a kernel restarted since: the newest run on disk
            return os.path.join(root, names[0]), None
        raise RunNotFoundError(f"inspect_run(): no run was launched in this process and there is no run log "
                               f"under {root}. Pass a Run, a run id or a run directory.")
    if not hasattr(run, "run_dir") and hasattr(getattr(run, "run", None), "run_dir"):
        run = run.run  # the RankFailedError or LaunchTimeoutError of a launch
    if hasattr(run, "run_dir"):
        if not os.path.isdir(run.run_dir):
            raise RunNotFoundError(f"inspect_run({run!r}): its run directory {run.run_dir} no longer exists "
                                   f"(only the newest runs are kept). {_known_runs_note(root)}")
        return run.run_dir, run
    if not isinstance(run, (str, os.PathLike)):
        raise TypeError(f"inspect_run(run={run!r}): expected a Run, a run id, a run directory or None, "
                        f"not a {type(run).__name__}")
    text = os.fspath(run)
    if os.path.basename(text) == "events.jsonl" and os.path.isfile(text):
        text = os.path.dirname(text) or "."
    if os.path.isdir(text) and (os.path.exists(os.path.join(text, "events.jsonl"))
                                or os.path.exists(os.path.join(text, "run.json"))):
        match = [known for known in recent_runs() if os.path.abspath(known.run_dir) == os.path.abspath(text)]
        return text, (match[-1] if match else None)
    for known in reversed(recent_runs()):  # a run of this process, wherever its log lives
        if known.run_id == text and os.path.isdir(known.run_dir):
            return known.run_dir, known
    names = run_dirs(root)
    if text in names:
        return os.path.join(root, text), None
    candidates = [name for name in names if text and os.sep not in text and text in name]
    if len(candidates) == 1:
        return os.path.join(root, candidates[0]), None
    if len(candidates) > 1:
        raise RunNotFoundError(f"inspect_run({text!r}): {len(candidates)} runs match: "
                               f"{', '.join(candidates[:5])}{' ...' if len(candidates) > 5 else ''}. "
                               "Give more of the run id.")
    what = "directory has no run log (events.jsonl)" if os.path.isdir(text) else "is no run id or run directory"
    raise RunNotFoundError(f"inspect_run({text!r}): this {what}. {_known_runs_note(root)}")


def inspect_run(run: Any = None, *, rank: Any = None, kind: Any = None, level: Any = None,
                search: str | None = None, regex: bool = False, page_size: int = 200) -> Any:
    """A panel to browse a run's whole log: filter by rank, log level, kind and text, one page at a time.

    ``run`` is a ``Run`` (``last_run()``), the ``RankFailedError``/``LaunchTimeoutError`` a launch raised, a run
    id (or a unique part of one) from the run log folder (``$NOTEBOOK_LAUNCHER_RUNS_DIR`` or
    ``~/.cache/notebook_launcher/runs``), a run directory, or None: the last run of this kernel, else the newest
    run log on disk (after a restart).
    It reads ``events.jsonl``, every event of the run (the ``Run`` in memory keeps only so many lines), and
    shows it a page (``page_size`` rows) at a time, so a run of millions of lines is fine in the browser.

    Optional first filters: ``rank`` (one rank or several), ``kind`` ("stdout", "stderr", "log", "failure",
    "exit", "launcher", "restart", "progress", "oom_retry", ...), ``level`` ("DEBUG" ... "CRITICAL": log records
    at that level and above only, output lines and progress rows hidden; or "errors and warnings": those at
    WARNING and above, failures, non-zero exits, hangs, out-of-memory retries and stderr lines that read as errors),
    ``search`` (case-insensitive text; a regular expression with ``regex=True``). The panel's controls change
    them; so does Python::

        from notebook_launcher import inspect_run, notebook_launcher

        notebook_launcher(train, num_processes=4)
        panel = inspect_run(rank=3, level="WARNING")   # the last run: rank 3's warnings and errors logged
        panel                                          # shows it in the cell
        panel.search.value = "nan"                     # only the rows that mention nan
        panel.rows[:5], panel.page_count, panel.go_to_line(1200)   # row 1200 of the run (the # column)
        inspect_run("20250101-120000-4242-a1b2c3")     # a past run, by id (or its directory)

    Raises ``RunNotFoundError`` (a LookupError) naming the argument and listing recent run ids when the run
    cannot be found. A run still going: the panel's reload button (or ``panel.reload()``) reads what it wrote
    since.
    """
    from .display.inspector import RunInspector  # ipywidgets: imported only when a panel is asked for

    run_dir, known = resolve_run(run)
    inspector = RunInspector(run_dir, known, page_size=page_size)
    if any(value is not None for value in (rank, kind, level, search)) or regex:
        inspector.filter(rank=rank, kind=kind, level=level, search=search, regex=regex or None)
    return inspector
