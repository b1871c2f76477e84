"""Debug mode's one-round collectives: a small all_reduce, all_gather or broadcast finished from every rank's
tensor, carried in the check's rows (``ops.check_agreement``), exactly as the backend would have finished it."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

_REDUCTIONS = {dist.ReduceOp.SUM: torch.sum, dist.ReduceOp.MAX: torch.amax, dist.ReduceOp.MIN: torch.amin,
               dist.ReduceOp.PRODUCT: torch.prod}  # (each over the ranks' dimension, 0)
_OUT_DTYPES = (torch.float32, torch.float64)  # reduced straight into the tensor (others: as the backend casts)
_FINISHED_FROM_CARRIED = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast")


def can_finish_from_carried(name: str, bound: dict, subject, group) -> bool:
    """Whether this rank could finish the call from everyone's tensor exactly as the backend would; the
    ranks then go that way only if all of them can (the answer travels in the check row)."""
    if name not in _FINISHED_FROM_CARRIED or bound.get("async_op") or not isinstance(subject, torch.Tensor):
        return False
    world_size = dist.get_world_size(group)
    if name == "all_reduce":  # (in half precision the backend rounds at every step; summing here rounds once)
        return bound.get("op", dist.ReduceOp.SUM) in _REDUCTIONS and \
            subject.dtype not in (torch.float16, torch.bfloat16)
    if name == "broadcast":
        return _source_index(bound, group) is not None
    if name == "all_gather":
        targets = bound.get("tensor_list") or []
        return len(targets) == world_size and all(t.shape == subject.shape and t.dtype == subject.dtype
                                                  for t in targets)
    output = bound.get("output_tensor")
    return output is not None and output.numel() == world_size * subject.numel() and output.is_contiguous()


def _source_index(bound: dict, group) -> int | None:
    """A broadcast's source as an index into the group's ranks (the order of the carried tensors)."""
    if bound.get("group_src") is not None:
        return int(bound["group_src"])
    if bound.get("src") is None:
        return None
    return int(bound["src"]) if group is None else dist.get_group_rank(group, int(bound["src"]))


def finish_from_carried(name: str, bound: dict, carried) -> None:
    """The collective's effect, computed from every rank's tensor (the same on every rank, in rank order)."""
    tensor = bound.get("tensor")
    reduce = _REDUCTIONS[bound.get("op", dist.ReduceOp.SUM)] if name == "all_reduce" else None
    if reduce is not None and tensor.dtype in _OUT_DTYPES and tensor.is_contiguous() and not tensor.requires_grad:
        reduce(carried, 0, out=tensor)  # (one op, no copy)
        return None
    with torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext():
        if reduce is not None:
            tensor.copy_(reduce(carried, 0))
        elif name == "all_gather":
            for target, piece in zip(bound["tensor_list"], carried):
                target.copy_(piece)
        elif name == "broadcast":
            bound["tensor"].copy_(carried[_source_index(bound, bound.get("group"))])
        else:
            bound["output_tensor"].view(carried.shape).copy_(carried)
    return None
