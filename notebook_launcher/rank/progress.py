"""report(): a rank says how far it is, for the panel's progress bar and charts (step time, metrics).

Worker side only; outside a launch (plain Python, torchrun, the kernel itself) it checks its arguments and does
nothing else, so training code can call it unconditionally.
"""

from __future__ import annotations

import math
import numbers

from ..schema.events import PROGRESS
from . import balance_meter, context


def report(step: int | None = None, *, total: int | None = None, **metrics) -> None:
    """Report this rank's progress: the step it finished, optionally the number of steps, and metrics.

    The panel shows a progress bar per rank and charts the step time and the first metric per rank, so a
    straggler (a slow GPU, a rank that loads more data) stands out::

        from notebook_launcher import report

        def train():
            for step in range(100):
                loss = ...
                report(step=step + 1, total=100, loss=loss.item())

    Metrics are numbers (a one-element tensor is fine). A tqdm bar in the worker is picked up the same way,
    without calling report().
    """
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0):
        raise TypeError(f"report(step=...) takes a whole number of steps >= 0, not {step!r}")
    if total is not None and (isinstance(total, bool) or not isinstance(total, numbers.Integral) or total <= 0):
        raise TypeError(f"report(total=...) takes the number of steps (a whole number > 0), not {total!r}")
    values = {}
    for name, value in metrics.items():
        if hasattr(value, "item") and callable(value.item):
            value = value.item()  # a tensor or a NumPy scalar
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"report({name}=...) takes a number (a float, an int, a one-element tensor), "
                            f"not {type(value).__name__}")
        value = float(value)
        values[name] = value if math.isfinite(value) else str(value)  # nan/inf stay visible, JSON stays valid
    emit = context.current.emit
    if emit is not None:
        if step is not None:
            balance_meter.step_done(balance_meter.REPORTED_STEPS, int(step))
        emit(PROGRESS, {"step": None if step is None else int(step), "total": None if total is None else int(total),
                        "metrics": values})
