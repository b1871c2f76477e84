"""What debug mode's check compares: for each collective call, a fixed row of integers per rank, and the message
when the rows differ.

A row: operation code, dtype code, ndim, detail (reduce op, src or dst), MAX_DIMS sizes, and last whether this
rank can carry its tensor with the row. Integers of a fixed count, so the ranks compare them in one small
all_gather without pickling (``collectives.check_agreement`` runs it; this module encodes, lays out and explains).
"""

from __future__ import annotations

import torch

MAX_DIMS = 8
HEADER = 4  # op code, dtype code, ndim, detail; then MAX_DIMS sizes; then "can carry"

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
           torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(_DTYPES)}

# The raw collectives checked in debug mode: (name of the tensor argument or None, what must agree)
#   "shape": op, dtype and shape    "dtype": op and dtype    "op": the operation (and a list's length) only
# (names this torch lacks stay listed: the operation codes below must not depend on the torch version)
RAW_COLLECTIVES = {
    "all_reduce": ("tensor", "shape"),
    "all_gather": ("tensor", "dtype"),  # uneven sizes are allowed there, not on gloo (CPU tensors: "shape")
    "all_gather_into_tensor": ("input_tensor", "shape"),
    "all_gather_single": ("input_tensor", "shape"),
    "reduce_scatter_single": ("input", "shape"),
    "broadcast": ("tensor", "shape"),
    "reduce": ("tensor", "shape"),
    "gather": ("tensor", "shape"),
    "scatter": ("tensor", "shape"),
    "reduce_scatter": ("output", "shape"),
    "reduce_scatter_tensor": ("input", "shape"),
    "all_to_all_single": ("input", "shape"),
    "all_gather_object": (None, "op"),
    "broadcast_object_list": ("object_list", "op"),
    "barrier": (None, "op"),
    "all_gather_coalesced": ("input_tensor_list", "op"),
    "all_reduce_coalesced": ("tensors", "op"),
    "_all_gather_base": ("input_tensor", "shape"),
    "_reduce_scatter_base": ("input", "shape"),
    "all_to_all": ("input_tensor_list", "op"),
    "gather_object": (None, "op"),
    "scatter_object_list": ("scatter_object_output_list", "op"),
    "monitored_barrier": (None, "op"),
}
# the functional collectives (DTensor, FSDP2's state dicts, compiled code), checked alike (``rank/functional``):
# each op's in-place and out= variants are checked under its name here
FUNCTIONAL_COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
                          "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
                          "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast")
# those added after collectives' own names and check_trigger: their codes come after them (below)
_ADDED_LATER = ("all_gather_coalesced", "all_reduce_coalesced", "_all_gather_base", "_reduce_scatter_base",
                "all_to_all", "gather_object", "scatter_object_list", "monitored_barrier")
# Every checked collective's name; its index is the row's operation code. A new collective adds its name at the
# end, so that codes stay what they were (hosts with different versions of the package still agree).
OPERATIONS = [f"torch.distributed.{name}" for name in RAW_COLLECTIVES if name not in _ADDED_LATER] + [
    f"notebook_launcher.ops.{name}" for name in ("gather", "gather_object", "broadcast", "broadcast_object_list",
                                                 "reduce", "pad_across_processes")] + [
    "notebook_launcher.check_trigger"] + [f"torch.distributed.{name}" for name in _ADDED_LATER] + [
    f"torch.ops._c10d_functional.{name}" for name in FUNCTIONAL_COLLECTIVES]
_CODES = {name: code for code, name in enumerate(OPERATIONS)}


def signature(operation: str, subject, rule: str, detail: int = 0) -> list[int]:
    """The integers every rank must agree on, and a last one (whether this rank can carry its tensor) that
    only decides, from everybody's answer, how the operation is finished."""
    row = [_CODES[operation], -1, -1, detail] + [-1] * MAX_DIMS + [0]
    if isinstance(subject, torch.Tensor):
        known = subject.dtype in _DTYPE_CODES
        row[1] = _DTYPE_CODES[subject.dtype] if known else len(_DTYPES) + stable_code(subject.dtype)
        if rule in ("shape", "dtype"):
            row[2] = subject.ndim
        if rule == "shape":
            for index, size in enumerate(subject.shape[:MAX_DIMS]):
                row[HEADER + index] = size
            if subject.ndim > MAX_DIMS:
                row[HEADER + MAX_DIMS - 1] = subject.numel()  # dims past the 8th still count, through the size
    elif isinstance(subject, list):
        row[2] = 1
        row[HEADER] = len(subject)
    return row


def detail_of(bound: dict) -> int:
    """The reduce op, source or destination of a raw collective's call (its bound arguments): the ranks must
    agree on it too."""
    for key in ("op", "src", "dst", "group_src", "group_dst"):
        value = bound.get(key)
        if value is not None:
            try:
                return int(value) + 1
            except (TypeError, ValueError):
                return stable_code(value)
    return 0


def stable_code(value) -> int:
    """A number for ``value`` that is the same in every process (``hash()`` of a str is not)."""
    return sum(ord(character) * (index + 1) for index, character in enumerate(str(value))) % 100_000


def mismatch(operation: str, rows: list[list[int]], sites: list) -> dict:
    """The ``shape_mismatch`` event's data for rows (without their last entry) that differ; its ``message`` is
    the text every rank raises."""
    operations = {row[0] for row in rows}
    if len(operations) > 1:
        message = _operation_mismatch_message(rows, sites)
    else:
        message = _shape_mismatch_message(operation, rows, sites)
    return {"operation": operation if len(operations) == 1 else None,
            "operations": [OPERATIONS[row[0]] for row in rows],
            "shapes": [_shape_of(row) for row in rows], "dtypes": [_dtype_of(row) for row in rows],
            "call_sites": sites, "message": message}


def _shape_of(row: list[int]) -> list[int] | None:
    if row[2] < 0:
        return None
    return row[HEADER:HEADER + min(row[2], MAX_DIMS)]


def _dtype_of(row: list[int]) -> str | None:
    if row[1] < 0:
        return None
    return str(_DTYPES[row[1]]).replace("torch.", "") if row[1] < len(_DTYPES) else f"other ({row[1]})"


def _shape_mismatch_message(operation: str, rows, sites) -> str:
    lines = ["Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid.",
             "", f"Operation: `{operation}`", "Input shapes:"]
    lines += [f"  - Process {rank}: {_shape_of(row)}" for rank, row in enumerate(rows)]
    if len({row[1] for row in rows}) > 1:
        lines += ["Input dtypes:"] + [f"  - Process {rank}: {_dtype_of(row)}" for rank, row in enumerate(rows)]
    lines += ["Call sites:"] + [f"  - Process {rank}: {site}" for rank, site in enumerate(sites)]
    return "\n".join(lines)


def _operation_mismatch_message(rows, sites) -> str:
    lines = ["Cannot apply desired operation: the processes called different collective operations at the same "
             "point, so they would wait on each other forever.", "", "Operations:"]
    lines += [f"  - Process {rank}: {OPERATIONS[row[0]]} at {sites[rank]}" for rank, row in enumerate(rows)]
    return "\n".join(lines)


SIGNATURE_INTS = len(signature("torch.distributed.barrier", None, "op"))
_HEAD_INTS = SIGNATURE_INTS + SIGNATURE_INTS % 2  # the carried bytes start 16-byte aligned (any dtype's view)


class Rows:
    """One thread's check row (the signature, then ``carry_bytes`` for a small tensor) and the table the ranks'
    rows are gathered into, kept from one check to the next (the same sizes every time), with the views that
    carry a tensor of a given dtype and shape: a check makes no tensor of its own on the CPU."""

    def __init__(self, world_size: int, device, carry_bytes: int):
        self.mine = torch.zeros(_HEAD_INTS + carry_bytes // 8, dtype=torch.int64)  # moved to ``device`` if need be
        self.head = self.mine[:_HEAD_INTS].numpy()
        self.table = torch.empty((world_size, self.mine.numel()), dtype=torch.int64, device=device)
        self.heads = self.table[:, :SIGNATURE_INTS]
        self.written: list = []  # the signature last written into ``head``
        self._views: dict = {}

    def views(self, dtype, shape, nbytes: int):
        """Where this rank's tensor goes in its row (on the CPU), and every rank's in the gathered table."""
        key = (dtype, shape)
        if key not in self._views:
            if len(self._views) >= 64:  # (a few shapes in a training loop; any number in a test)
                self._views.clear()
            mine = self.mine[_HEAD_INTS:].view(torch.uint8)[:nbytes].view(dtype).view(shape)
            every = self.table[:, _HEAD_INTS:].view(torch.uint8)[:, :nbytes].view(dtype)
            self._views[key] = (mine, every.view((self.table.shape[0],) + tuple(shape)))
        return self._views[key]
