"""Launch mechanisms, one module each, behind one interface: ``launch(plan, run, display, attempts)``.

- ``local``: forked or spawned workers on this machine (one node, or this node of several);
- ``hosts``: every host's ranks through an agent started over SSH or by mpirun;
- ``in_kernel``: one process, in the kernel itself;
- ``xla``: TPU cores through torch_xla.

``attempts`` owns the policy of new attempts for all of them; ``driver.launch`` picks the mechanism and tells
the story's end.
"""

from .driver import launch
from .hosts import HostSettings

__all__ = ["HostSettings", "launch"]
