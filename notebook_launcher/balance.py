"""Where the time goes: which rank the others wait for, and how much memory each rank took (``last_run().balance``).

Read from the ranks' ``balance`` events (``balance_meter`` measures them in each rank). Pure data in, data out,
so the Run and the panel read a run the same way. The data comes from worker pipes: whatever does not have the
expected form is left out, never trusted or raised on.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

KEEP_STEPS = 1024  # step records kept per rank (the newest): about 100 KB a rank
STRAGGLER_GAP = 0.20  # the others wait at least this much more of their time than the straggler
MOST_STEPS = 2 / 3  # ...and, where steps are known, it waits least in at least this share of them
MIN_STEPS = 5
# Evidence in time: scheduling on a loaded machine can make any rank of a short run look slow, so no straggler is
# named for a run whose ranks' functions all took less than MIN_RUN_S, nor, over the whole function (no steps),
# unless every other rank waited at least MIN_WAIT_S longer than it, in seconds.
MIN_RUN_S = 1.0
MIN_WAIT_S = 0.5
UNEVEN_MEMORY = 1.5  # the memory line: the largest peak is at least this many times the smallest


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


class BalanceBook:
    """Every rank's latest figures, fed event by event (``Attempts.on_event``); ``balance()`` reads them."""

    def __init__(self):
        self.ranks: dict[int, dict] = {}
        self._made: Balance | None = None  # balance() of the figures as they are (None: made anew on demand)

    def clear(self) -> None:
        self.ranks.clear()  # a new attempt: the figures of the last one are not this one's
        self._made = None

    def all_final(self) -> bool:
        return bool(self.ranks) and all(entry["final"] for entry in self.ranks.values())

    def observe(self, rank: int, data) -> bool:
        """Take the data of a rank's ``balance`` event; True if it changed the figures."""
        if not isinstance(data, dict) or not isinstance(rank, int):
            return False
        elapsed, waited = _number(data.get("elapsed")), _number(data.get("waited"))
        if elapsed is None or waited is None:
            return False
        entry = self.ranks.setdefault(rank, {"steps": [], "step_source": None})
        source = data.get("step_source") if isinstance(data.get("step_source"), str) else None
        if source != entry["step_source"]:
            entry["steps"], entry["step_source"] = [], source
        steps = data.get("steps")
        for record in steps if isinstance(steps, list) else ():
            if isinstance(record, list) and len(record) in (3, 4):
                at, so_far = _number(record[1]), _number(record[2])
                step = record[0] if isinstance(record[0], int) and not isinstance(record[0], bool) else None
                # a DDP step's own wait in its backward (None: not sampled); 3 items: all in "so far"
                in_backward = _number(record[3]) if len(record) == 4 else 0.0
                if at is not None and so_far is not None:
                    entry["steps"].append((step, at, so_far, in_backward, len(record) == 4))
        del entry["steps"][:-KEEP_STEPS]
        self._made = None
        entry.update(elapsed=elapsed, waited=min(waited, elapsed), final=data.get("final") is True,
                     peak_rss=_number(data.get("peak_rss")))
        cuda = data.get("cuda")
        entry["cuda"] = {key: _number(cuda.get(key)) for key in ("peak_allocated", "peak_reserved", "total")} \
            if isinstance(cuda, dict) else None
        return True

    def balance(self) -> Balance:
        """The Balance of the figures as they are (made once per change: about 0.04 s at 64 ranks of 1024 steps)."""
        if self._made is None:
            self._made = balance_of(self.ranks)
        return self._made


@dataclasses.dataclass
class Balance:
    """The run's balance, by global rank.

    - ``straggler``: the rank the others wait for, or None when no rank clearly is one. The rule, over the
      steps every rank has with their waits known (DDP's sampled steps, ``ddp_watch``; 5 or more in common;
      else over the whole function): the rank that waited the
      smallest share of that time is the straggler when every other rank waited at least 20 points more of its
      own (``STRAGGLER_GAP``) and, over steps, it waited least in at least two thirds of them. (Steps leave out
      what comes before the loop, such as loading a model, which every rank waits through alike.) Only where
      the evidence can carry it: never for a run whose ranks all took less than 1 s (``MIN_RUN_S``), and over
      the whole function only when every other rank waited at least 0.5 s longer than it (``MIN_WAIT_S``): in
      a run of a few hundred milliseconds, the order in which a loaded machine scheduled the ranks is no
      straggler.
    - ``step_wait_share``: {rank: share of the common steps' time spent waiting} when the rule used steps.
    - ``wait_share``: {rank: share of the function's time spent inside collectives}: waiting for the others,
      communication included (for DDP, only the wait of its backward for the gradient all_reduce, measured on
      the sampled steps, the others counted at their mean).
    - ``step_time``: {rank: median seconds per step} for ranks whose steps are known (DDP's synchronized
      backward passes, else ``report(step=...)``; the newest 1024).
    - ``peak_memory``: {rank: bytes}: the CUDA allocator's peak on the rank's GPU, else its peak resident set.
    - ``device_memory``: {rank: bytes of the rank's GPU, or None on CPU}.
    - ``memory``: {rank: {"peak_rss", "peak_allocated", "peak_reserved", "total"}} as measured.
    - ``ranks_measured`` and ``final`` (every rank sent its figures at its function's end).
    """

    straggler: int | None
    wait_share: dict
    step_wait_share: dict
    step_time: dict
    peak_memory: dict
    device_memory: dict
    memory: dict
    ranks_measured: list
    final: bool

    def memory_uneven(self) -> tuple[int, int] | None:
        """(largest, smallest) rank by peak memory when the largest is ≥ 1.5x the smallest, else None."""
        peaks = {rank: peak for rank, peak in self.peak_memory.items() if peak}
        if len(peaks) < 2:
            return None
        largest, smallest = max(peaks, key=peaks.get), min(peaks, key=peaks.get)
        return (largest, smallest) if peaks[largest] >= UNEVEN_MEMORY * peaks[smallest] else None

    def summary(self) -> str:
        """The lines the text display prints at the end: the straggler and uneven memory; "" when balanced."""
        lines = []
        if self.straggler is not None:
            decided_by = self.step_wait_share or self.wait_share
            others = sorted(rank for rank in decided_by if rank != self.straggler)
            shares = [decided_by[rank] for rank in others]
            low, high = round(min(shares) * 100), round(max(shares) * 100)
            waited = f"{low}%" if high - low <= 5 else f"{low}-{high}%"
            who = f"rank {others[0]}" if len(others) == 1 else f"ranks {', '.join(map(str, others))}"
            its = ("its" if len(others) == 1 else "their") + (" steps'" if self.step_wait_share else "")
            lines.append(f"straggler: rank {self.straggler} ({who} waited {waited} of {its} time for it; it "
                         f"waited {round(decided_by[self.straggler] * 100)}%)")
        uneven = self.memory_uneven()
        if uneven is not None:
            largest, smallest = uneven
            ratio = self.peak_memory[largest] / self.peak_memory[smallest]
            lines.append(f"memory: rank {largest} peaked at {format_bytes(self.peak_memory[largest])}, {ratio:.1f}x "
                         f"rank {smallest} (on mixed GPUs the smallest sets the batch size)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """For the panel's Balance section (keys as strings, as JSON has them)."""
        return {"straggler": self.straggler, "final": self.final,
                "ranks": {str(rank): {"wait_share": self.wait_share.get(rank),
                                      "step_wait_share": self.step_wait_share.get(rank),
                                      "step_time": self.step_time.get(rank),
                                      "peak_memory": self.peak_memory.get(rank),
                                      "device_memory": self.device_memory.get(rank)}
                          for rank in self.ranks_measured},
                "summary": self.summary()}


def format_bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


def balance_of(ranks: dict) -> Balance:
    """The Balance of every rank's latest figures (``BalanceBook.ranks``)."""
    wait_share, step_time, peak_memory, device_memory, memory, per_step = {}, {}, {}, {}, {}, {}
    for rank, entry in sorted(ranks.items()):
        wait_share[rank] = entry["waited"] / entry["elapsed"] if entry["elapsed"] > 0 else 0.0
        per_step[rank] = _per_step(entry["steps"])
        if per_step[rank]:
            step_time[rank] = statistics.median(duration for duration, _ in per_step[rank].values())
        cuda = entry["cuda"] or {}
        memory[rank] = {"peak_rss": entry["peak_rss"], **{key: cuda.get(key) for key in
                                                           ("peak_allocated", "peak_reserved", "total")}}
        peak_memory[rank] = cuda.get("peak_allocated") or entry["peak_rss"]
        device_memory[rank] = cuda.get("total")
    common = set.intersection(*({step for step, (_, waited) in steps.items() if waited is not None}
                                 for steps in per_step.values())) if per_step else set()
    step_wait_share = {}
    if len(common) >= MIN_STEPS and len(ranks) >= 2:
        for rank, steps in per_step.items():
            total = sum(steps[step][0] for step in common)
            step_wait_share[rank] = sum(steps[step][1] for step in common) / total if total > 0 else 0.0
    long_enough = bool(ranks) and max(entry["elapsed"] for entry in ranks.values()) >= MIN_RUN_S
    straggler = _straggler(step_wait_share or wait_share, per_step, common if step_wait_share else (),
                           {rank: entry["waited"] for rank, entry in ranks.items()}) if long_enough else None
    return Balance(straggler=straggler,
                   wait_share=wait_share, step_wait_share=step_wait_share, step_time=step_time,
                   peak_memory=peak_memory, device_memory=device_memory, memory=memory,
                   ranks_measured=sorted(ranks), final=bool(ranks) and all(e["final"] for e in ranks.values()))


def _per_step(steps: list) -> dict:
    """{step: (seconds, seconds waited, or None where the step's wait was not sampled)} from the cumulative
    records (the first kept one is the origin)."""
    durations = {}
    for (step_before, at_before, waited_before, _, _), (step, at, waited, in_backward, ddp) in zip(steps, steps[1:]):
        # DDP's records are of its sampled steps and the step before each: a duration only from the one before
        if step is not None and at >= at_before and (not ddp or step_before == step - 1):
            duration = at - at_before
            durations[step] = (duration, None if in_backward is None else
                               max(0.0, min(waited - waited_before + in_backward, duration)))
    return durations


def _straggler(shares: dict, per_step: dict, common, waited: dict) -> int | None:
    if len(shares) < 2:
        return None
    candidate = min(shares, key=shares.get)
    if any(share < shares[candidate] + STRAGGLER_GAP for rank, share in shares.items() if rank != candidate):
        return None
    if not common and any(waited[rank] < waited[candidate] + MIN_WAIT_S for rank in shares if rank != candidate):
        return None  # over the whole function: a gap of a few hundred milliseconds is scheduling, not a straggler
    if common:
        least = sum(1 for step in common
                    if min(shares, key=lambda rank: _step_share(per_step[rank][step])) == candidate)
        if least < MOST_STEPS * len(common):
            return None
    return candidate


def _step_share(step: tuple) -> float:
    duration, waited = step
    return waited / duration if duration > 0 else 0.0
