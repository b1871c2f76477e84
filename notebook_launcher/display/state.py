"""The state of one run as the panel shows it, built from the events as they arrive.

``RunState.to_json()`` is the payload of the MIME type ``application/vnd.notebook-launcher.run.v1+json``
(documented in ``labextension/SCHEMA.md``). It is bounded whatever the run prints: each rank keeps its newest
``lines_per_rank`` lines and ``history_points`` progress points; everything is in the run log on disk.

A ``hang_notice`` (made by the kernel's watchdog) is the ``hang`` card: live while it is open, each rank it lists
showing its place as a status badge ("waiting", "busy", "in DDP"); when progress resumes it stays, not live, and
the ranks are "running" again; the notice before it goes to ``hangs`` (without its stacks: the run log has them).

The ranks' ``balance`` events become ``balance`` (``Balance.to_json()`` of ``balance.py``, the rule the Run uses
too), made anew at most every ``BALANCE_EVERY_S`` while the run goes on (a few hundred bytes per rank), and at
the end.
"""

from __future__ import annotations

import re
import time

from ..balance import BalanceBook
from ..schema.events import (
    BALANCE,
    BATCH_SIZE,
    DISPLAY,
    EXIT,
    FAILURE,
    HANG_NOTICE,
    LAUNCHER,
    LOG,
    OOM_RETRY,
    PROGRESS,
    RECORD_LEVEL,
    RECORD_MESSAGE,
    RECORD_TIME,
    RESTART,
    SHAPE_MISMATCH,
    STATUS,
    STREAM,
    TEXT_ESCAPED,
    TRIGGER,
    Event,
)
from ..schema.lines import LogRecords, StreamLines
from ..schema.status import RankStatus, RunStatus, StopReason
from .describe import describe
from .final import failure_card, hang_card, number
from .rank_state import LINES_PER_RANK, MAX_TEXT, RankState
from .summary import LevelCounts, rank_row, run_summary

MIME_TYPE = "application/vnd.notebook-launcher.run.v1+json"
MAX_CARDS = 20  # shape mismatches, OOM retries and triggers kept for the panel
MAX_NOTES = 50  # the launcher's own lines (hosts' stderr lines among them) kept for the panel
MAX_HANGS = 10  # earlier hang notices kept for the panel
BALANCE_EVERY_S = 5.0
# a hang notice's rank state -> the status badge it shows while the notice is live
HANG_BADGES = {"waiting": RankStatus.WAITING, "busy": RankStatus.BUSY, "in_ddp": RankStatus.IN_DDP}
# statuses a notice may replace with its badge
_ALIVE = (RankStatus.STARTING, RankStatus.RUNNING, *HANG_BADGES.values())

# tqdm's bar as it prints it: "train:  45%|####5     | 45/100 [00:01<00:01, 40.20it/s]"
_TQDM = re.compile(r"(?:(?P<desc>[^|:]{0,80}): *)?\d{1,3}%\|[^|]{0,200}\| *(?P<n>\d+)/(?P<total>\d+|\?) *\[")
_TQDM_TAIL = 400  # a bar is short: only a line's end is searched, whatever a rank prints (no backtracking blowup)


class RunState:
    """Folds events into what the panel shows. Not thread-safe: fed from the launching cell's thread."""

    def __init__(self, run_id: str, run_dir: str, device: str, backend: str, start_method: str,
                 num_processes: int, world_size: int, ranks, lines_per_rank: int = LINES_PER_RANK,
                 detached: bool = False, began_before: bool = False):
        # detached: the run has a supervisor of its own (detach=True), which a panel may ask to stop it.
        # began_before: the run began before this state (a detached run attached): its times are its events' own
        # (started at its first event, ended at its last), not the moments this kernel saw them (_from_events)
        self.header = {"run_id": run_id, "run_dir": run_dir, "device": device, "backend": backend,
                       "start_method": start_method, "num_processes": num_processes, "world_size": world_size,
                       "detached": detached}
        self.status = RunStatus.STARTING
        self.started_at = time.time()
        self._started = time.monotonic()
        self._ended: float | None = None
        self._from_events = began_before
        self._first_event: float | None = None
        self._last_event: float | None = None
        self.attempt = 1
        self.notes: list[str] = []
        self.lines_per_rank = lines_per_rank
        self.ranks = {rank: RankState(rank, lines_per_rank) for rank in ranks}
        self.shape_mismatches: list[dict] = []
        self.oom_retries: list[dict] = []
        self.triggers: list[dict] = []
        self.batch_size: int | None = None
        self.failure: dict | None = None
        self.result: dict | None = None
        self.hang: dict | None = None  # the newest hang notice (see _on_hang_notice)
        self.hangs: list[dict] = []  # the earlier ones, oldest first
        self._hang_marked: set[int] = set()  # ranks whose status is the live notice's badge
        self.balance: dict | None = None  # Balance.to_json(), rounded
        self._balance_book = BalanceBook()
        self._balance_due = 0.0
        self._balance_pending = False  # figures came that the balance does not show yet
        self._line_count = 0
        self._text_escaped = False  # the note of TEXT_ESCAPED is made (once per run)
        self._levels = LevelCounts()  # each rank's warnings and errors, for the summary
        self.changes = 0  # bumped by every change, so a display knows when to publish

    # -- events ------------------------------------------------------------------------------------------------
    def observe(self, event: Event) -> None:
        """One event; a run of lines (``lines.StreamLines``, ``LogRecords``) whole, kept as it is in its rank's
        column (``RankState.add_run``), unless it may hold a tqdm bar (read line by line, as its Events)."""
        kind = type(event)
        if self._from_events:
            self._event_time(event.time)
        if kind is StreamLines or kind is LogRecords:
            if kind is StreamLines and "|" in "".join(event.texts):
                for line in event.events():
                    self.observe(line)
            else:
                self._add_run(event)
            return
        handler = _HANDLERS.get(event.kind)
        if handler is not None:
            handler(self, event)
            self.changes += 1

    def _event_time(self, when: float) -> None:
        """A run attached after it began: its start is its first event's time (the events' clock is this
        machine's ``time.monotonic()``, whichever process reads it), its end its last event's."""
        if not when or when != when:  # a time the run log could not hold (written as null, read as 0.0)
            return
        if self._first_event is None:
            self._first_event = self._started = when
            self.started_at = time.time() - (time.monotonic() - when)
        self._last_event = when if self._last_event is None else max(self._last_event, when)

    def _add_run(self, run) -> None:
        rank = self.ranks.get(run.rank) or self._rank(run)
        rank.add_run(self._line_count + 1, self._started, run)
        if type(run) is LogRecords:
            for index, frame in enumerate(run.frames, self._line_count + 1):
                self._levels.add(run.rank, index, max(0.0, frame[RECORD_TIME] - self._started), frame[RECORD_LEVEL],
                                 frame[RECORD_MESSAGE])
        self._line_count += len(run)
        rank.lines_total += len(run)
        self.changes += len(run)

    def set_ranks(self, ranks) -> None:
        """This node's global ranks, once a rendezvous has assigned them; columns of other ranks go."""
        ranks = list(ranks)
        if sorted(ranks) != sorted(self.ranks):
            self.ranks = {rank: self.ranks.get(rank) or RankState(rank, self.lines_per_rank) for rank in ranks}
            self.changes += 1

    def note(self, text: str) -> None:
        self.notes.append(text[:MAX_TEXT])
        del self.notes[:-MAX_NOTES]
        self.changes += 1

    def _rank(self, event: Event) -> RankState:
        if event.rank not in self.ranks:
            self.ranks[event.rank] = RankState(event.rank, self.lines_per_rank)
        return self.ranks[event.rank]

    def _t(self, event: Event) -> float:
        return round(max(0.0, event.time - self._started), 3)

    def _add_line(self, event: Event, kind: str, text: str, level: str | None = None,
                  logger: str | None = None) -> None:
        rank = self._rank(event)
        self._line_count += 1
        rank.lines_total += 1
        line = {"n": self._line_count, "t": self._t(event), "kind": kind, "text": text[:MAX_TEXT]}
        if level is not None:
            line["level"], line["logger"] = level, logger
            self._levels.add(event.rank, line["n"], line["t"], level, text)
        rank.lines.append(line)

    def _on_status(self, event: Event) -> None:
        rank = self._rank(event)
        state = event.data.get("state")
        if state == "starting":
            rank.status, rank.pid, rank.exit_code = RankStatus.STARTING, event.data.get("pid"), None
            if event.data.get("host"):
                rank.host = event.data["host"]
        elif state in ("running", "finished", "failed"):
            rank.status = state
            if "exit_code" in event.data:
                rank.exit_code = event.data["exit_code"]
        if self.status == RunStatus.STARTING and state == "running":
            self.status = RunStatus.RUNNING

    def _on_stream(self, event: Event) -> None:
        text = str(event.data.get("text", ""))
        is_bar = "|" in text and self._tqdm_progress(event, text)
        if event.data.get("redraw") or event.data.get("stack_dump"):
            return  # a line being redrawn (its final state arrives as a line), or stacks the notice shows
        if not is_bar or text.strip():  # a bar's final state is a line, not an error: never "stderr"
            self._add_line(event, "stdout" if is_bar else event.data.get("stream", "stdout"), text)

    def _tqdm_progress(self, event: Event, text: str) -> bool:
        match = _TQDM.search(text[-_TQDM_TAIL:])
        if match is None:
            return False
        total = None if match["total"] == "?" else int(match["total"])
        self._record_progress(event, int(match["n"]), total, {}, label=(match["desc"] or "").strip() or None)
        return True

    def _on_display(self, event: Event) -> None:
        """A rank's display is a line of its column (rank 0's is in the cell too: ``rich.py``)."""
        said = describe(DISPLAY, event.data)
        for line in said.said if said is not None else ():
            self._add_line(event, "stdout", f"[display] {line}")

    def _on_log(self, event: Event) -> None:
        data = event.data
        said = describe(LOG, data)
        if said is None:
            return  # an in_order placeholder: nothing to show
        text = str(data["message"]) + (f"\n{said.detail}" if said.detail else "")
        self._add_line(event, LOG, text, level=data.get("level"), logger=data.get("logger"))

    def _on_progress(self, event: Event) -> None:
        data = event.data
        self._record_progress(event, data.get("step"), data.get("total"), data.get("metrics") or {})

    def _record_progress(self, event: Event, step, total, metrics: dict, label: str | None = None) -> None:
        rank = self._rank(event)
        # as shown: 6 significant digits (the run log keeps the reported values whole)
        metrics = {name: float(f"{value:.6g}") if isinstance(value, float) else value
                   for name, value in metrics.items()}
        now = self._t(event)
        step_time = None
        if step is not None and rank._last_step is not None and step > rank._last_step[0]:
            step_time = round((now - rank._last_step[1]) / (step - rank._last_step[0]), 6)
        elif rank.progress:
            step_time = rank.progress.get("step_time")
        if step is not None and (rank._last_step is None or step != rank._last_step[0]):
            rank._last_step = (step, now)
        merged = {**((rank.progress or {}).get("metrics") or {}), **metrics}
        rank.progress = {"step": step, "total": total, "metrics": merged, "step_time": step_time}
        if label:
            rank.progress["label"] = label
        rank.history.append({"step": step, "t": now, "step_time": step_time, "metrics": dict(metrics)})
        rank.history_count += 1

    def _on_failure(self, event: Event) -> None:
        rank = self._rank(event)
        rank.status = RankStatus.FAILED
        retry = event.data.get("oom_retry")
        if isinstance(retry, dict):  # out of memory in find_executable_batch_size: a retry, not a failure
            self._add_line(event, "retry", f"out of memory at batch size {retry.get('batch_size')}: retried at "
                                           f"batch size {retry.get('new_batch_size')}")
            return
        for line in describe(FAILURE, event.data).said:
            self._add_line(event, "stderr", line)

    def _on_exit(self, event: Event) -> None:
        rank = self._rank(event)
        rank.exit_code = event.data.get("exit_code")
        if rank.status not in (RankStatus.FINISHED, RankStatus.FAILED):
            if event.data.get("stopped_by_launcher"):
                rank.status = RankStatus.STOPPED  # ended by the launcher because of another rank, not its own fault
            else:
                rank.status = RankStatus.FINISHED if rank.exit_code == 0 else RankStatus.FAILED
        for line in describe(EXIT, event.data).said:  # killed by a signal, and not by the launcher
            self._add_line(event, "stderr", line)

    def _on_shape_mismatch(self, event: Event) -> None:
        data = event.data
        operations = data.get("operations") or []
        shapes, dtypes, sites = data.get("shapes") or [], data.get("dtypes") or [], data.get("call_sites") or []
        processes = [{"rank": index, "operation": operations[index] if index < len(operations) else None,
                      "shape": shapes[index] if index < len(shapes) else None,
                      "dtype": dtypes[index] if index < len(dtypes) else None,
                      "call_site": sites[index] if index < len(sites) else None}
                     for index in range(max(len(operations), len(shapes)))]
        self._bounded(self.shape_mismatches).append({
            "operation": data.get("operation") or " / ".join(dict.fromkeys(o for o in operations if o)),
            "t": self._t(event), "attempt": self.attempt, "processes": processes,
            "message": str(data.get("message", ""))[:MAX_TEXT * 4]})

    def _on_oom_retry(self, event: Event) -> None:
        data = event.data
        self._bounded(self.oom_retries).append({
            "t": self._t(event), "ranks": data.get("ranks", [event.rank]), "batch_size": data.get("batch_size"),
            "new_batch_size": data.get("new_batch_size"), "error": str(data.get("error", ""))[:MAX_TEXT]})

    def _on_batch_size(self, event: Event) -> None:
        self.batch_size = event.data.get("batch_size")

    def _on_trigger(self, event: Event) -> None:
        self._bounded(self.triggers).append(
            {"rank": event.rank, "t": self._t(event), "attempt": self.attempt,
             "call_site": event.data.get("call_site")})

    def _on_text_escaped(self, event: Event) -> None:
        """A rank escaped lone surrogates in its text: one note for the run, whichever ranks did."""
        if not self._text_escaped:
            self._text_escaped = True
            self.note(describe(TEXT_ESCAPED, event.data, event.rank).text)

    def _on_launcher(self, event: Event) -> None:
        self.note(str(event.data.get("text", "")))

    def _on_restart(self, event: Event) -> None:
        """Every rank starts again (an out-of-memory step down, or max_restarts), on this host or on all."""
        self.attempt = int(event.data.get("attempt", self.attempt + 1))
        if event.data.get("reason") != "out of memory":  # (the out-of-memory card says it already)
            self.note(str(event.data.get("text", "")))
        self._end_hang()
        size = event.data.get("batch_size")
        divider = f"attempt {self.attempt}" + (f" at batch size {size}" if size is not None else "")
        for rank in self.ranks.values():
            rank.status, rank.exit_code, rank._last_step = RankStatus.STARTING, None, None
            self._line_count += 1
            rank.lines_total += 1
            rank.lines.append({"n": self._line_count, "t": self._t(event), "kind": "attempt", "text": divider})
        self._balance_book.clear()
        self.balance = None

    def _on_balance(self, event: Event) -> None:
        """Made when the state is next read (``to_json``): at once for a rank the balance does not name yet and
        when every rank's figures are final, else at most every BALANCE_EVERY_S."""
        if self._balance_book.observe(event.rank, event.data):
            self._balance_pending = True
            every_rank_final = len(self._balance_book.ranks) >= len(self.ranks) and self._balance_book.all_final()
            if every_rank_final or str(event.rank) not in ((self.balance or {}).get("ranks") or {}):
                self._balance_due = 0.0

    def _refresh_balance(self, now: float) -> None:
        self._balance_due = now + BALANCE_EVERY_S
        self._balance_pending = False
        if self._balance_book.ranks:
            self.balance = _rounded(self._balance_book.balance().to_json())

    def _on_hang_notice(self, event: Event) -> None:
        """The watchdog's "open" notice is the live card (a second "open" while one is live replaces it); its
        "cleared" notice ends it: not live, its ranks "running" again where nothing else happened to them."""
        data = event.data
        if data.get("state") == "cleared":
            if self.hang is not None and self.hang["live"]:
                self._end_hang()
                self.hang["cleared_after"] = number(data.get("quiet_s"))
                self.hang["cleared_t"] = self._t(event)
                self.hang["cleared_text"] = str(data.get("text", ""))[:MAX_TEXT]
            return
        if data.get("state") != "open":
            return
        started = self.hang["t"] if self.hang is not None and self.hang["live"] else self._t(event)
        if self.hang is not None:
            if self.hang["live"]:
                self._end_hang()
            else:
                self._keep_earlier()
        self.hang = hang_card(data, started, self._t(event))
        ranks = self.hang["ranks"]
        for key, place in ranks.items():
            badge = HANG_BADGES.get(place["state"])
            rank = self.ranks.get(int(key)) if key.lstrip("-").isdigit() else None
            if badge is not None and rank is not None and rank.status in _ALIVE:
                rank.status = badge
                self._hang_marked.add(rank.rank)

    def _keep_earlier(self) -> None:
        """The newest notice, over, goes to the earlier ones (without its stacks: the run log has them)."""
        self.hangs.append({**self.hang, "live": False, "stacks": {}, "stacks_dropped": len(self.hang["stacks"])})
        del self.hangs[:-MAX_HANGS]
        self.hang = None

    def _end_hang(self) -> None:
        """The live notice is over (cleared, a restart, the end of the run): badges back to "running"."""
        if self.hang is not None:
            self.hang["live"] = False
        for marked in self._hang_marked:
            rank = self.ranks.get(marked)
            if rank is not None and rank.status in HANG_BADGES.values():
                rank.status = RankStatus.RUNNING
        self._hang_marked.clear()

    @staticmethod
    def _bounded(items: list) -> list:
        if len(items) >= MAX_CARDS:
            del items[0]
        return items

    # -- the end -----------------------------------------------------------------------------------------------
    def finish(self, status: str, failure: dict | None = None, result_type: str | None = None,
               stuck_ranks=()) -> None:
        """The run ended: its final status, the failure to show first, and which ranks were stuck in a hang."""
        self.status = status
        self._ended = time.monotonic() if self._last_event is None else self._last_event
        self._refresh_balance(self._ended)
        self.failure = failure_card(failure) if failure is not None else None
        self.result = {"type": result_type} if result_type is not None else None
        self._end_hang()
        if self.hang is not None and self.failure and self.failure.get("kind") in (StopReason.HANG, StopReason.TIMEOUT):
            self._keep_earlier()  # the failure tells where every rank was, with their stacks
        for rank in stuck_ranks:
            if rank in self.ranks:
                self.ranks[rank].status = RankStatus.STUCK
        for rank in self.ranks.values():
            if rank.status in (RankStatus.STARTING, RankStatus.RUNNING) and status != RunStatus.FINISHED:
                stopped_by_a_hang = status in (RunStatus.HUNG, RunStatus.TIMED_OUT)
                rank.status = RankStatus.STUCK if stopped_by_a_hang else RankStatus.STOPPED
        self.changes += 1

    def elapsed(self) -> float:
        return round((self._ended or time.monotonic()) - self._started, 3)

    def to_json(self) -> dict:
        if self._balance_pending and time.monotonic() >= self._balance_due:
            self._refresh_balance(time.monotonic())
        ranks = []
        for rank_number in sorted(self.ranks):
            rank = self.ranks[rank_number]
            payload = rank.to_json()
            # (an attribute too: delta.py sends a rank's row only when it changed, as its other fields)
            rank.summary = payload["summary"] = rank_row(payload, self._levels.of(rank_number))
            ranks.append(payload)
        state = {"version": 1, **self.header, "status": self.status, "started_at": self.started_at,
                 "elapsed": self.elapsed(), "attempt": self.attempt, "notes": list(self.notes), "ranks": ranks,
                 "shape_mismatches": list(self.shape_mismatches), "oom_retries": list(self.oom_retries),
                 "batch_size": self.batch_size, "triggers": list(self.triggers), "failure": self.failure,
                 "result": self.result, "hang": dict(self.hang) if self.hang else None, "hangs": list(self.hangs),
                 "balance": self.balance}
        state["summary"] = run_summary(state, self._levels.early)
        return state


def _rounded(value):
    """Figures to 4 decimals: the panel shows percentages and seconds, not 17 digits."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    return value


# the kinds the panel shows (``Kind.panel``; tests/test_event_kinds.py checks it)
_HANDLERS = {
    STATUS: RunState._on_status, STREAM: RunState._on_stream, LOG: RunState._on_log,
    PROGRESS: RunState._on_progress, FAILURE: RunState._on_failure, EXIT: RunState._on_exit,
    SHAPE_MISMATCH: RunState._on_shape_mismatch, OOM_RETRY: RunState._on_oom_retry,
    BATCH_SIZE: RunState._on_batch_size, TRIGGER: RunState._on_trigger, LAUNCHER: RunState._on_launcher,
    RESTART: RunState._on_restart, HANG_NOTICE: RunState._on_hang_notice, BALANCE: RunState._on_balance,
    DISPLAY: RunState._on_display, TEXT_ESCAPED: RunState._on_text_escaped,
}
