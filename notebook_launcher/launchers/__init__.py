"""Launch mechanisms, one module each, behind one interface (``base.Launcher``): ``launch(plan, display, intake,
policy)`` runs every attempt and returns how the last one ended (``outcome.LaunchOutcome``).

- ``local``: forked or spawned workers on this machine (one node, or this node of several; device "xla": one
  process, torch_xla's host of every ordinal);
- ``hosts``: every host's ranks through an agent per host, started over SSH or by mpirun (``cluster/starts.py``);
- ``slurm``: the same, the agents started by srun as a step of a Slurm job;
- ``in_kernel``: one process, in the kernel itself.

``intake.EventIntake`` takes every event of an attempt and ``restarts.RestartPolicy`` decides new attempts for
all of them; ``driver.launch`` picks the mechanism (``choose_launcher``), writes its outcome into the Run and
tells the story's end.
"""

from .driver import launch
from .hosts import HostSettings

__all__ = ["HostSettings", "launch"]
