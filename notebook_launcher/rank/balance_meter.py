"""What a rank measures for the run's balance: how long it waited for the others, its steps, its peak memory.

Worker side. Waiting is what the rank's progress record adds up (``ProgressRecord.waited``): the whole time of
each collective called through torch.distributed (communication included); and for a DDP model the part of its
backward spent waiting for the gradient all_reduce to finish (DDP's ``finalize_backward``), not the backward's
own computation, measured on the steps ``ddp_watch`` samples (on the others it is not known: the rank's total
counts the sampled steps' mean wait for each of them). A step ends at each synchronized backward of the rank's
DDP models; a rank without DDP ends one at each ``report(step=...)``.

The kernel gets ``balance`` events: at the first step or collective after every ``INTERVAL_S`` seconds, when
``MAX_STEPS`` step records wait to be sent, and once when the function returns or raises (``final``). The
kernel reads them in ``balance.py``. Cost: a clock read and a list append per step; nothing per collective but
the record's own sum.
"""

from __future__ import annotations

import time

from ..schema.events import BALANCE
from . import context
from .memory import peak_memory_figures

INTERVAL_S = 10.0
MAX_STEPS = 2048  # step records in one event (a small DDP model on CPU makes ~300 steps a second)
DDP_STEPS = "ddp"
REPORTED_STEPS = "report"

_meter = None  # the rank's meter, from start() to finish() in a launched worker


class _NoRecord:
    """A rank without a process group (one process): no collectives to wait in; its memory all the same."""

    waited = 0.0
    due = float("inf")
    on_due = None


class BalanceMeter:
    """One rank's figures since its function started."""

    def __init__(self, emit, progress):
        self.emit, self.progress = emit, progress
        self.started = time.monotonic()
        # [step, seconds since started, seconds waited so far outside DDP's backward] and for DDP's steps the
        # step's wait in its backward (None: not sampled), not sent yet
        self.steps: list = []
        self.ddp_first: int | None = None  # the first DDP step noted (the owner's ``step`` counts on from it)
        self.ddp_sampled = 0  # DDP steps whose wait is known
        self.ddp_waited = 0.0  # the sampled steps' waits
        self.step_source: str | None = None
        self.step_owner: object = None  # the DDP model whose backward ends a step
        progress.on_due = self.send
        progress.due = self.started + INTERVAL_S

    def step_done(self, source: str, step: int | None, owner: object = None, ddp_wait: float | None = None):
        if owner is not None:
            if self.step_owner is None:
                self.step_owner = owner
            elif owner is not self.step_owner:
                return None  # a second DDP model in the rank (a GAN's two): the first one's backward is the step
        if source != self.step_source:
            if self.step_source == DDP_STEPS:
                return None  # report(step=...) beside a DDP model: DDP's backward is the step
            if self.step_source is not None:  # a DDP model after report()ed steps: its steps from now on
                self.steps.clear()
            self.step_source = source
        now = time.monotonic()
        record = [step, now - self.started, self.progress.waited]
        if source == DDP_STEPS:
            record.append(None)
            if self.ddp_first is None:
                self.ddp_first = step
            if ddp_wait is not None:
                self.ddp_wait_known(record, ddp_wait)
        self.steps.append(record)
        if now >= self.progress.due or len(self.steps) >= MAX_STEPS:
            self.send()
        return record

    def ddp_wait_known(self, record: list, seconds: float) -> None:
        """A sampled DDP step's wait, now or once the GPU has passed it (its record may have been sent)."""
        if len(record) == 4 and record[3] is None:
            record[3] = seconds
            self.ddp_sampled += 1
            self.ddp_waited += seconds

    def waited(self) -> float:
        """Seconds waited so far, the DDP steps that were not sampled counted at the sampled ones' mean (the
        meter notes only the sampled steps and the step before each; the owner's ``step`` counts them all)."""
        if not self.ddp_sampled or self.ddp_first is None:
            return self.progress.waited
        steps = max(self.ddp_sampled, getattr(self.step_owner, "step", 0) - self.ddp_first + 1)
        return self.progress.waited + self.ddp_waited * steps / self.ddp_sampled

    def send(self, final: bool = False) -> None:
        now = time.monotonic()
        data = {"elapsed": now - self.started, "waited": self.waited(), "steps": self.steps,
                "step_source": self.step_source, "final": final, **peak_memory_figures()}
        self.steps = []
        self.progress.due = now + INTERVAL_S
        self.emit(BALANCE, data)


def start() -> None:
    """In a launched worker, just before the function runs: measure from now on (``context.current``'s writer
    and progress record)."""
    global _meter
    rank = context.current
    _meter = BalanceMeter(rank.emit, rank.progress if rank.progress is not None else _NoRecord())


def step_done(source: str, step: int | None = None, owner: object = None, ddp_wait: float | None = None):
    """A step of this rank ended (``source``: ``DDP_STEPS`` or ``REPORTED_STEPS``; ``owner``: the DDP model's
    watch; ``ddp_wait``: a sampled DDP step's wait, when known now); its record (for ``ddp_wait_known``), or
    None (outside a launch, or not the rank's step)."""
    return _meter.step_done(source, step, owner, ddp_wait) if _meter is not None else None


def ddp_wait_known(record: list | None, seconds: float) -> None:
    """The wait of a sampled DDP step whose record ``step_done`` gave, once the GPU has timed it."""
    if _meter is not None and record:
        _meter.ddp_wait_known(record, seconds)


def forget() -> None:
    """In a process forked from the rank: its figures are not the rank's, it sends none."""
    global _meter
    _meter = None


def finish() -> None:
    """The function returned or raised: the last figures, once."""
    global _meter
    meter, _meter = _meter, None
    if meter is not None:
        meter.progress.on_due, meter.progress.due = None, float("inf")
        try:
            meter.send(final=True)
        except Exception:  # noqa: BLE001 - the kernel gone, a device error: the function's own outcome comes first
            pass
