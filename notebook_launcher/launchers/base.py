"""What every launch mechanism is: one ``launch`` that runs a checked plan and returns rank 0's result or raises.

``driver.launch`` makes the Run, its display, the attempt's events and the restart policy, picks the mechanism
(``driver.choose_launcher``) and calls its ``launch``; a new mechanism is a class that declares ``Launcher`` and
one line there.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..display import Display
from ..plan import LaunchPlan
from ..runs import Run
from .attempts import RestartPolicy
from .intake import AttemptEvents


class Launcher(Protocol):
    """One way to run the ranks of a plan (here, in the kernel, on several hosts, in a Slurm job)."""

    def launch(self, plan: LaunchPlan, run: Run, display: Display, events: AttemptEvents,
               policy: RestartPolicy) -> Any:
        """Run every attempt of ``plan`` and return rank 0's result, or raise the error that says what happened
        (with ``run``'s status set). Each attempt's events go through ``events`` (``begin(ranks)``, ``on_event``
        for each event or run of lines, ``end()``, and ``finished()`` for the result); after a failed attempt
        ``policy.next_plan`` says whether there is another, so restarts behave the same in every mechanism."""
        ...
