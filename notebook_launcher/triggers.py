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

import torch
import torch.distributed as dist

from . import ops

_flag = False
_on_trigger = None  # worker side: reports set_trigger() to the kernel


def set_trigger() -> None:
    """Ask every rank to stop at the next ``check_trigger()``."""
    global _flag
    _flag = True
    if _on_trigger is not None:
        _on_trigger({"call_site": ops.call_site()})


def check_trigger() -> bool:
    """True on every rank if any rank called ``set_trigger()`` since the last check (and resets it)."""
    global _flag
    if not ops._distributed():
        fired, _flag = _flag, False
        return fired
    flag = torch.tensor([1 if _flag else 0], device=ops._check_device())
    with ops._collective("notebook_launcher.check_trigger", None, "op"):
        ops._raw["all_reduce"](flag, op=dist.ReduceOp.MAX)
    if flag.item():
        _flag = False
        return True
    return False
