"""The collective helpers of Accelerate's ``accelerate.utils.operations`` that a launched function calls
(``from notebook_launcher.ops import gather``): in debug mode each first checks that every rank agrees, and a
mismatch raises ``DistributedOperationException`` on every rank with each process's shape. They run on the rank
side (``rank/collectives.py``); this module is their public name."""

from .rank.collectives import (
                       DistributedOperationException,
                       broadcast,
                       broadcast_object_list,
                       gather,
                       gather_object,
                       pad_across_processes,
                       reduce,
)

__all__ = ["DistributedOperationException", "broadcast", "broadcast_object_list", "gather", "gather_object",
           "pad_across_processes", "reduce"]
