"""The record of each launch (``Run``) and the runs this process has launched (``last_run()``, ``recent_runs()``).

The launchers fill a Run as events arrive; the inspector and the doctor read Runs. Neither of those depends on
the launcher: they depend on this module.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from .failure import RankFailure

KEEP_IN_MEMORY = 20
_recent_runs: list = []


@dataclasses.dataclass
class Run:
    """Everything about one launch, kept after it returns or raises (see ``last_run()``).

    ``results`` and ``exit_codes`` are by global rank; ``events`` holds what every rank said (the run log in
    ``run_dir`` holds it too, without the in-memory cap).
    """

    run_id: str
    run_dir: str
    device: str
    backend: str
    start_method: str
    num_processes: int
    world_size: int
    status: str = "starting"  # starting | running | finished | failed | timed out | hung | interrupted
    results: dict = dataclasses.field(default_factory=dict)
    results_left_out: dict = dataclasses.field(default_factory=dict)  # rank -> why its result did not travel
    results_unavailable: dict = dataclasses.field(default_factory=dict)  # rank -> (type, why it could not be rebuilt)
    exit_codes: dict = dataclasses.field(default_factory=dict)
    failures: dict = dataclasses.field(default_factory=dict)
    root_cause: RankFailure | None = None
    events: list = dataclasses.field(default_factory=list)
    events_dropped: int = 0
    attempts: int = 0
    batch_sizes: dict = dataclasses.field(default_factory=dict)  # find_executable_batch_size: latest size per function
    oom_retries: list = dataclasses.field(default_factory=list)  # each restart after an out-of-memory error
    stuck_ranks: list = dataclasses.field(default_factory=list)  # a hang or timeout: the ranks that were waiting
    stacks: dict = dataclasses.field(default_factory=dict)  # a hang or timeout: each rank's Python stacks (text)
    panel_state: dict | None = None  # the run panel's final state (labextension/SCHEMA.md), when it was shown
    started_at: float = dataclasses.field(default_factory=time.time)
    duration: float = 0.0

    def result(self, rank: int = 0) -> Any:
        return self.results.get(rank)

    def output(self, rank: int | None = None, stream: str | None = None) -> list[str]:
        """The lines the workers printed (all ranks, or one), in the order received."""
        return [event.data["text"] for event in self.events
                if event.kind == "stream" and not event.data.get("redraw") and (rank is None or event.rank == rank)
                and (stream is None or event.data.get("stream") == stream)]

    def panel(self, **filters):
        """An ipywidgets inspector of this run's whole log: filter by rank, level and kind, search, page through
        it (``notebook_launcher.inspect_run`` takes the same filters, and past runs by id or directory)."""
        from .display.inspector import inspect_run

        return inspect_run(self, **filters)

    def summary(self) -> dict:
        return {
            "run_id": self.run_id, "status": self.status, "device": self.device, "backend": self.backend,
            "start_method": self.start_method, "num_processes": self.num_processes, "world_size": self.world_size,
            "attempts": self.attempts, "exit_codes": self.exit_codes, "duration_s": round(self.duration, 4),
            "root_cause": dataclasses.asdict(self.root_cause) if self.root_cause else None,
            "result_types": {rank: type(value).__name__ for rank, value in self.results.items()},
        }

    def __repr__(self) -> str:
        return (f"<Run {self.run_id} {self.status}: {self.num_processes} x {self.device}/{self.backend} "
                f"({self.start_method}), {self.duration:.2f} s, log in {self.run_dir}>")


def last_run() -> Run | None:
    """The most recent launch in this process (results by rank, exit codes, events, failures)."""
    return _recent_runs[-1] if _recent_runs else None


def recent_runs() -> list[Run]:
    """The launches of this process, oldest first (the last ``KEEP_IN_MEMORY``)."""
    return list(_recent_runs)


def remember(run: Run) -> None:
    """A launch has begun: it is ``last_run()`` from now on, even if it fails before any rank starts."""
    _recent_runs.append(run)
    del _recent_runs[:-KEEP_IN_MEMORY]
