"""One summary of a run, computed from the panel's state (``RunState.to_json()``), that the JupyterLab panel and the
fallback (``fallback.py``: Colab, Kaggle, VS Code, GitHub, nbviewer) both render at their top.

Two parts, so that a live delta (``delta.py``) resends only what changed:

- ``run_summary(state)`` is the state's ``summary`` field: the verdict (what happened, in one title, then where each
  rank is when that matters), the balance line, the run id and how to open the whole log, and the first warnings
  and errors (the newest are among the ranks' lines, the first ones may not be). It changes rarely while a run goes
  on (a live hang notice's seconds move with each update).
- ``rank_row(rank)`` is each rank's ``summary``: step/total, s/step, ETA, last line, warning and error counts,
  as display strings (the same words in every frontend); with the rank's ``status``, its row.
"""

from __future__ import annotations

import re

from ..schema.status import RunStatus, StopReason

MAX_LAST = 120  # characters of a rank's last line in its row (the line itself is in its lines)
MAX_DETAIL = 300  # characters of one line of the verdict's detail
MAX_DETAIL_LINES = 16
EARLY_LINES = 20  # the run's first warnings and errors the summary keeps ...
EARLY_PER_RANK = 5  # ... at most this many of each rank
MAX_EARLY_TEXT = 300
_RANK_LINE = re.compile(r"^rank \d+: ")
_WAITING = re.compile(r"waiting (\d+(?:\.\d+)?) s")


def seconds(value) -> str:
    """Durations as the panel writes them (format.ts's formatElapsed): "3.2 s", "2 min 05 s", "1 h 02 min"."""
    if not isinstance(value, (int, float)) or value < 0:
        return ""
    if value < 60:
        return f"{value:.1f} s"
    whole = int(value)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def inspect_call(run_id: str) -> str:
    return f'inspect_run("{run_id}")'


class LevelCounts:
    """Each rank's warnings and errors (log records) since the start, and the run's first ones (``early``)."""

    COUNTED = ("WARNING", "ERROR", "CRITICAL")

    def __init__(self):
        self.counts: dict[int, list[int]] = {}
        self.early: list[dict] = []

    def add(self, rank: int, n: int, t: float, level, text) -> None:
        if level not in self.COUNTED:
            return
        counts = self.counts.setdefault(rank, [0, 0])
        counts[level != "WARNING"] += 1
        if len(self.early) < EARLY_LINES and counts[0] + counts[1] <= EARLY_PER_RANK:
            self.early.append({"rank": rank, "n": n, "t": round(t, 3), "level": level,
                               "text": str(text)[:MAX_EARLY_TEXT]})

    def of(self, rank: int) -> tuple[int, int]:
        return tuple(self.counts.get(rank, (0, 0)))


def rank_row(rank: dict, counts: tuple[int, int] = (0, 0)) -> dict:
    """One rank's row (its status is the rank's own ``status``): step/total, s/step, ETA, last line, and
    ``counts``, its warnings and errors (log records) since the start. Empty fields and zero counts are left out."""
    progress = rank.get("progress") or {}
    step, total, step_time = progress.get("step"), progress.get("total"), progress.get("step_time")
    eta = None
    if rank.get("status") in ("running", "starting") and step is not None and total and step_time:
        eta = seconds(max(0, total - step) * step_time)
    lines = rank.get("lines") or []
    last = lines[-1]["text"].rstrip("\n").rsplit("\n", 1)[-1] if lines else ""
    row = {"step": "" if step is None else f"{step}/{total}" if total else str(step),
           "speed": f"{step_time:.3g} s/step" if step_time else "", "eta": eta or "",
           "last": last[:MAX_LAST] + ("…" if len(last) > MAX_LAST else ""), "warnings": counts[0], "errors": counts[1]}
    return {name: value for name, value in row.items() if value}  # (what a row does not say, it leaves out)


def run_summary(state: dict, early: list | None = None) -> dict:
    """The state's ``summary`` (see the module's docstring); ``early``: the first warnings and errors."""
    kind, title, detail = verdict(state)
    balance = state.get("balance") or {}
    title = title if len(title) <= MAX_DETAIL else f"{title[:MAX_DETAIL]}…"
    return {"verdict": kind, "title": title, "detail": [line[:MAX_DETAIL] for line in detail][:MAX_DETAIL_LINES],
            "balance": balance_line(balance), "run_id": state.get("run_id"),
            "inspect": inspect_call(str(state.get("run_id"))), "early": list(early or [])}


def balance_line(balance: dict) -> str | None:
    """The balance's own line when a rank straggles, else how evenly the ranks wait (None before any figures)."""
    if balance.get("summary"):
        return balance["summary"]
    shares = [figures.get("wait_share") for figures in (balance.get("ranks") or {}).values()]
    shares = [share for share in shares if isinstance(share, (int, float))]
    if not shares:
        return None
    low, high = round(min(shares) * 100), round(max(shares) * 100)
    spread = f"{low}%" if low == high else f"{low}–{high}%"
    return f"balanced: no straggler (each rank waits {spread} of its time in collectives)"


def verdict(state: dict) -> tuple[str, str, list[str]]:
    """(kind, title, detail lines): kind is running | starting | finished | failed | hang | hung | timed out |
    interrupted | oom (a run that goes on or finished after out-of-memory retries)."""
    status = str(state.get("status") or "")
    failure = state.get("failure") or {}
    retries = state.get("oom_retries") or []
    steps = oom_lines(retries)
    hang = state.get("hang") or {}
    if status == RunStatus.FAILED and failure.get("kind", StopReason.FAILURE) == StopReason.FAILURE:
        who = f"rank {failure['rank']}" if isinstance(failure.get("rank"), int) else "a rank"
        said = _last_line(failure.get("traceback")) or _first_line(failure.get("verdict")) \
            or _first_line(failure.get("message")) or failure.get("type") or ""
        return "failed", f"Failed: {who} raised {said}".rstrip(), steps
    if status in (RunStatus.HUNG, RunStatus.TIMED_OUT):
        title = "Timed out" if status == RunStatus.TIMED_OUT else "Hung"
        message = "\n".join(str(failure.get(key) or "") for key in ("verdict", "message"))  # (final.failure_card)
        why = next((line.split(": ", 1)[1] for line in message.splitlines() if "stopped making progress: " in line),
                   "") or _where(hang) or "the ranks stopped making progress"
        places = [line for line in message.splitlines() if _RANK_LINE.match(line)] or _places(hang, 0.0)
        why = f"the ranks {why[5:]}" if why.startswith("they ") else why
        return status, f"{title} after {seconds(state.get('elapsed'))}: {why.rstrip('.')}", places
    if status == RunStatus.INTERRUPTED:
        return "interrupted", "Interrupted: the run was stopped before it finished", []
    if hang.get("live") and status in (RunStatus.RUNNING, RunStatus.STARTING):
        since = max(0.0, (state.get("elapsed") or 0) - (hang.get("t") or 0))
        quiet = (hang.get("quiet_s") or 0) + since
        text = str(hang.get("text", "")).splitlines()
        why = str(hang.get("verdict") or "").strip().rstrip(".") \
            or next((line.strip().rstrip(".") for line in text if line.startswith("ranks wait")), "") or _where(hang)
        timeout = [line.strip() for line in text if "timeout=" in line]
        return "hang", f"Possible hang: {quiet:.0f} s without progress" + (f"; {why}" if why else ""), \
            [*_places(hang, since), *timeout]
    if retries:
        now = f"{status} at batch size {state.get('batch_size') or retries[-1].get('new_batch_size')}"
        return "oom", f"Retried after out of memory at batch size {retries[0].get('batch_size')}: {now}", steps
    if status == RunStatus.FINISHED:
        return "finished", f"Finished in {seconds(state.get('elapsed'))}", []
    return status or "starting", status.capitalize() if status else "Starting", []


def oom_lines(retries: list) -> list[str]:
    """Each step down after an out-of-memory error, in order, with its error."""
    out = []
    for retry in retries:
        ranks = retry.get("ranks") or []
        out.append(f"out of memory on rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))} at batch "
                   f"size {retry.get('batch_size')}: retried at {retry.get('new_batch_size')} "
                   f"({retry.get('error', '')})")
    return out


def _where(hang: dict) -> str:
    """Which rank diverged (the watchdog's word for it), in a few words."""
    diverged = hang.get("diverged")
    if isinstance(diverged, int):
        return f"rank {diverged} diverged (it is not in the collective the others wait in)"
    return ""


def _places(hang: dict, since: float) -> list[str]:
    """Where each rank waits, as the notice said, its seconds moved on by ``since``."""
    def moved(match: re.Match) -> str:
        return f"waiting {float(match[1]) + since:.0f} s"
    return [f"rank {key}: {_WAITING.sub(moved, place.get('text', ''), count=1)}"
            for key, place in (hang.get("ranks") or {}).items()]


def _first_line(text) -> str:
    return next((line.strip() for line in str(text or "").splitlines() if line.strip()), "")


def _last_line(text) -> str:
    return next((line.strip() for line in reversed(str(text or "").splitlines()) if line.strip()), "")
