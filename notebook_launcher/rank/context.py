"""What a launched rank's hooks share, in one object set by the worker: its event writer, its progress record
(where it is, for hang diagnosis), the launch's debug mode and whether it has peers.

The hooks (``collectives``, ``memory``, ``progress``, ``triggers``, ``balance_meter``, ``logging``, ``ddp_watch``) read
``context.current`` when they run, so the order they are installed in does not matter. Outside a launch it is
``OUTSIDE``: nothing is sent, nothing recorded, and ``find_executable_batch_size`` retries locally.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankContext:
    writer: Any = None  # the rank's EventWriter (or the XLA host's OrdinalWriters): emit, emit_record, ...
    progress: Any = None  # the rank's ProgressRecord, where it has a process group
    debug: bool | None = None  # the launch's debug=True/False; None: ACCELERATE_DEBUG_MODE decides at each call
    distributed: bool = False  # the rank has peers: an out-of-memory error restarts the whole group

    @property
    def emit(self) -> Callable[..., None] | None:
        """The writer's ``emit(kind, data)``, or None outside a launch."""
        return self.writer.emit if self.writer is not None else None


OUTSIDE = RankContext()
current = OUTSIDE  # replaced only by enter(); read as ``context.current`` (never imported by name)


def enter(context: RankContext) -> None:
    """This process is (now) the rank ``context`` describes."""
    global current
    current = context
