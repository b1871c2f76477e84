"""What every launch mechanism is: one ``launch`` that runs a checked plan and returns how it ended.

``driver.launch`` makes the Run, its display, the event intake and the restart policy, picks the mechanism
(``driver.choose_launcher``) and calls its ``launch``; a new mechanism is a class that declares ``Launcher`` and
one line there.
"""

from __future__ import annotations

from typing import Protocol

from ..display import Display
from ..plan import LaunchPlan
from .intake import EventIntake
from .outcome import LaunchOutcome
from .restarts import RestartPolicy


class Launcher(Protocol):
    """One way to run the ranks of a plan (here, in the kernel, on several hosts, in a Slurm job)."""

    def launch(self, plan: LaunchPlan, display: Display, intake: EventIntake,
               policy: RestartPolicy) -> LaunchOutcome:
        """Run every attempt of ``plan`` and return how the last one ended (``LaunchOutcome``: the result, or the
        status, failures and error); the mechanism writes nothing into the Run, ``driver.launch`` does. Each
        attempt's events go through ``intake`` (``begin(ranks)``, ``on_event`` for each event or run of lines,
        ``end()``, and ``finished()`` for the result); after a failed attempt ``policy.next_plan`` says whether there is
        another, so restarts behave the same in every mechanism. Only an interrupt (``KeyboardInterrupt``) or
        an error of the user's own function run in the kernel is raised."""
        ...
