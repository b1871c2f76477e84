"""What a rank measures for the run's balance: how long it waited for the others, its steps, its peak memory.

Worker side. Waiting is what the rank's progress record adds up (``ProgressRecord.waited``): the whole time of
each collective called through torch.distributed (communication included), and for a DDP model only the part
of its backward spent waiting for the gradient all_reduce to finish (DDP's ``finalize_backward``), not the
backward's own computation (``ddp_watch``). A step ends at each synchronized backward of the rank's DDP models;
a rank without DDP ends one at each ``report(step=...)``.

The kernel gets ``balance`` events: at the first step or collective after every ``INTERVAL_S`` seconds, when
``MAX_STEPS`` step records wait to be sent, and once when the function returns or raises (``final``). The
kernel reads them in ``balance.py``. Cost: a clock read and a list append per step; nothing per collective but
the record's own sum.
"""

from __future__ import annotations

import time

from .events import BALANCE
from .memory import peak_memory_figures

INTERVAL_S = 10.0
MAX_STEPS = 2048  # step records in one event (a small DDP model on CPU makes ~300 steps a second)
DDP_STEPS = "ddp"
REPORTED_STEPS = "report"

_meter = None  # the rank's meter, set by connect() in a launched worker


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
        self.steps: list = []  # [step, seconds since started, seconds waited so far], not sent yet
        self.step_source: str | None = None
        self.step_owner: object = None  # the DDP model whose backward ends a step
        progress.on_due = self.send
        progress.due = self.started + INTERVAL_S

    def step_done(self, source: str, step: int | None, owner: object = None) -> None:
        if owner is not None:
            if self.step_owner is None:
                self.step_owner = owner
            elif owner is not self.step_owner:
                return  # a second DDP model in the rank (a GAN's two): the first one's backward is the step
        if source != self.step_source:
            if self.step_source == DDP_STEPS:
                return  # report(step=...) beside a DDP model: DDP's backward is the step
            if self.step_source is not None:  # a DDP model after report()ed steps: its steps from now on
                self.steps.clear()
            self.step_source = source
        now = time.monotonic()
        self.steps.append([step, now - self.started, self.progress.waited])
        if now >= self.progress.due or len(self.steps) >= MAX_STEPS:
            self.send()

    def send(self, final: bool = False) -> None:
        now = time.monotonic()
        data = {"elapsed": now - self.started, "waited": self.progress.waited, "steps": self.steps,
                "step_source": self.step_source, "final": final, **peak_memory_figures()}
        self.steps = []
        self.progress.due = now + INTERVAL_S
        self.emit(BALANCE, data)


def connect(emit, progress) -> None:
    """In a launched worker, just before the function runs: measure from now on."""
    global _meter
    _meter = BalanceMeter(emit, progress if progress is not None else _NoRecord())


def step_done(source: str, step: int | None = None, owner: object = None) -> None:
    """A step of this rank ended (``source``: ``DDP_STEPS`` or ``REPORTED_STEPS``; ``owner``: the DDP model's
    watch); nothing outside a launch."""
    if _meter is not None:
        _meter.step_done(source, step, owner)


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
