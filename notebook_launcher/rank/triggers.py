"""Early stopping across ranks: ``set_trigger()`` on any rank, ``check_trigger()`` on all of them.

    for batch in loader:
        loss = step(batch)
        if should_stop(loss):            # true on one rank only
            set_trigger()
        if check_trigger():              # true on every rank at the same step, then reset
            break

``check_trigger`` is a collective (one all_reduce of one number): every rank must call it at the same points.
In a launched worker the kernel is told which rank set the trigger and where.
"""

from __future__ import annotations

from ..schema.events import TRIGGER
from . import collectives, context

_flag = False  # this rank called set_trigger() since the last check


def set_trigger() -> None:
    """Ask every rank to stop at the next ``check_trigger()``."""
    global _flag
    _flag = True
    emit = context.current.emit  # in a launched worker the kernel hears of it at once
    if emit is not None:
        emit(TRIGGER, {"call_site": collectives.call_site()})


def check_trigger() -> bool:
    """True on every rank if any rank called ``set_trigger()`` since the last check (and resets it)."""
    global _flag
    fired = collectives.any_rank(_flag, "notebook_launcher.check_trigger")
    _flag = False
    return fired
