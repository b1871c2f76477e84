"""Debug mode's one-round collectives: a small all_reduce, all_gather or broadcast finished from every rank's
tensor, carried in the check's rows (``collectives.check_agreement``), only where the result is bit for bit the
backend's.

Where it might not be, the call goes to torch as without debug mode (a second round): arguments torch refuses
(its own error, then), a non-contiguous tensor (gloo reduces such a tensor its own way), half precision (the
backend rounds at every step), a bool's sum or product (gloo adds its bytes), a float sum or product over more
than two ranks (the backend's order of addition is its own, and floats do not associate), and, seen once every
rank's tensor is here, a float max or min over a NaN or over zeros of both signs (the backend keeps whichever of
two "equal" values it met first).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

_REDUCTIONS = {dist.ReduceOp.SUM: torch.sum, dist.ReduceOp.MAX: torch.amax, dist.ReduceOp.MIN: torch.amin,
               dist.ReduceOp.PRODUCT: torch.prod}  # (each over the ranks' dimension, 0)
_ORDERED = (dist.ReduceOp.MAX, dist.ReduceOp.MIN)  # complex tensors: torch refuses them (ValueError)
_OUT_DTYPES = (torch.float32, torch.float64)  # reduced straight into the tensor (others: as the backend casts)
_FINISHED_FROM_CARRIED = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast")


def can_finish_from_carried(name: str, bound: dict, subject, group) -> bool:
    """Whether this rank could finish the call from everyone's tensor exactly as the backend would; the
    ranks then go that way only if all of them can (the answer travels in the check row)."""
    if name not in _FINISHED_FROM_CARRIED or bound.get("async_op") or not isinstance(subject, torch.Tensor) \
            or not subject.is_contiguous():
        return False
    world_size = dist.get_world_size(group)
    if name == "all_reduce":
        op = bound.get("op", dist.ReduceOp.SUM)
        if not isinstance(op, dist.ReduceOp.RedOpType) or op not in _REDUCTIONS \
                or subject.dtype in (torch.float16, torch.bfloat16):
            return False
        if subject.is_complex():
            return op == dist.ReduceOp.SUM and world_size <= 2
        if subject.dtype == torch.bool:  # gloo adds and multiplies a bool's bytes (True + True is a byte 2)
            return op in _ORDERED
        return op in _ORDERED or not subject.is_floating_point() or world_size <= 2
    if name == "broadcast":
        return _source_index(bound, group) is not None
    if name == "all_gather":
        targets = bound.get("tensor_list")
        return isinstance(targets, list) and len(targets) == world_size and all(
            isinstance(t, torch.Tensor) and t.shape == subject.shape and t.dtype == subject.dtype
            and t.device == subject.device and t.is_contiguous() for t in targets)
    output = bound.get("output_tensor")
    return isinstance(output, torch.Tensor) and output.dtype == subject.dtype and output.device == subject.device \
        and output.numel() == world_size * subject.numel() and output.is_contiguous()


def _source_index(bound: dict, group) -> int | None:
    """A broadcast's source as an index into the group's ranks (the order of the carried tensors); None where
    it is none of them (torch then raises its own error)."""
    source, group_source = bound.get("src"), bound.get("group_src")
    if group_source is not None:
        source = group_source if source is None else None  # (both: torch refuses it)
    elif group is not None and isinstance(source, int):
        ranks = dist.get_process_group_ranks(group)
        source = ranks.index(source) if source in ranks else None
    if not isinstance(source, int) or isinstance(source, bool):
        return None
    return source if 0 <= source < dist.get_world_size(group) else None


def finish_from_carried(name: str, bound: dict, carried) -> bool:
    """The collective's effect, computed from every rank's tensor (the same on every rank, in rank order).
    False, with nothing done, where the carried values make the backend's order of reduction show (every
    rank sees the same values, so all of them then take the backend's way)."""
    tensor = bound.get("tensor")
    reduce = _REDUCTIONS[bound.get("op", dist.ReduceOp.SUM)] if name == "all_reduce" else None
    if reduce is not None and bound.get("op") in _ORDERED and tensor.is_floating_point() and _order_shows(carried):
        return False
    if reduce is not None and tensor.dtype in _OUT_DTYPES and not tensor.requires_grad:
        reduce(carried, 0, out=tensor)  # (one op, no copy)
        return True
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
    return True


def _order_shows(carried) -> bool:
    """Whether a max or min over the ranks (dimension 0) depends on the order the backend meets them in: a NaN,
    or a zero of each sign at one place."""
    if bool(torch.isnan(carried).any()):
        return True
    zeros = carried == 0
    negative = torch.signbit(carried)
    return bool(((zeros & negative).any(0) & (zeros & ~negative).any(0)).any())
