"""A tensor of the result that could not come back whole: unpickled in the kernel, it raises ``ShardedResultError``
with the reason, so the launch raises ``ResultUnavailableError`` instead of returning one rank's shard.

Both sides: the rank puts a ``Refused`` where a sharded tensor was (``rank/shards.py``); the kernel's unpickling
calls ``refuse``.
"""

from __future__ import annotations


class ShardedResultError(ValueError):
    """The result held a tensor that is one rank's shard, and it could not be gathered into a full tensor."""


def refuse(reason: str):
    raise ShardedResultError(reason)


class Refused:
    """Stands in the result for a sharded tensor that is not sent."""

    def __init__(self, reason: str):
        self.reason = reason

    def __reduce__(self):
        return refuse, (self.reason,)
