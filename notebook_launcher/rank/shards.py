"""A result holding sharded tensors comes back as full tensors, or is refused; never a shard that looks whole.

A DTensor (FSDP2's ``model.state_dict()``, tensor parallel) holds only this rank's shard, yet its ``.shape`` is
the whole tensor's; sent as it is, the kernel would get a tensor that says [32, 16] and holds [16, 16], which no
process group can gather any more. So before the result is packed, while the process group still exists, each
DTensor is gathered with ``full_tensor()`` — a collective, so only when every rank's result holds the same
DTensors (same count, shapes and dtypes, agreed through the group's store: a rank without any never waits).
Otherwise, and for other shards (``ShardedTensor``), the tensor is replaced by ``schema.shards.Refused``, so
the launch raises ``ResultUnavailableError`` naming the fix.
"""

from __future__ import annotations

import copy
import sys

from ..schema.shards import Refused

_KEY = "notebook_launcher/result_shards/"
FIX = ("gather it in the function, on every rank: get_model_state_dict(model, options=StateDictOptions("
       "full_state_dict=True)) (torch.distributed.checkpoint.state_dict), or tensor.full_tensor() for a DTensor")


def whole(value, rank: int):
    """``value`` with each DTensor gathered into a full tensor, or each sharded tensor refused."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    sharded = getattr(sys.modules.get("torch.distributed._shard.sharded_tensor"), "ShardedTensor", None)
    kinds = tuple(kind for kind in (dtensor, sharded) if kind is not None)
    found: list = []
    _walk(value, kinds, found.append)
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return _replaced(value, kinds, {}, "the process group was destroyed before the function returned") \
            if found else value
    store, world_size = dist.distributed_c10d._get_default_store(), dist.get_world_size()
    mine = repr([(type(item).__name__, tuple(item.size()), str(item.dtype)) for item in found])
    store.set(f"{_KEY}{rank}", mine)  # every rank says what it holds; only a holder waits to read the others
    if not found:
        return value
    others = [store.get(f"{_KEY}{other}").decode() for other in range(world_size)]
    if dtensor is not None and all(text == mine for text in others) and all(isinstance(t, dtensor) for t in found):
        return _replaced(value, kinds, {id(item): item.full_tensor() for item in found}, "")
    differs = [other for other, text in enumerate(others) if text != mine]
    who = f"rank{'s' if len(differs) > 1 else ''} {', '.join(map(str, differs))}"
    reason = f"{who} did not return the same sharded tensors" if differs else "it is a ShardedTensor"
    return _replaced(value, kinds, {}, reason)


def _walk(value, kinds, visit) -> None:
    if kinds and isinstance(value, kinds):
        visit(value)
    elif isinstance(value, dict):
        for item in value.values():
            _walk(item, kinds, visit)
    elif type(value) in (list, tuple):
        for item in value:
            _walk(item, kinds, visit)


def _replaced(value, kinds, full: dict, reason: str):
    """``value`` with each sharded tensor replaced by its full tensor (``full``, by id) or refused."""
    if kinds and isinstance(value, kinds):
        if id(value) in full:
            return full[id(value)]
        return Refused(f"it holds a {type(value).__name__} of shape {list(value.size())}, one rank's shard, which "
                       f"could not be gathered after the function returned ({reason}): {FIX}")
    if isinstance(value, dict):
        clone = copy.copy(value)  # keeps a state_dict's _metadata
        for key, item in value.items():
            clone[key] = _replaced(item, kinds, full, reason)
        return clone
    if type(value) in (list, tuple):
        return type(value)(_replaced(item, kinds, full, reason) for item in value)
    return value
