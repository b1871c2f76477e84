"""Functional collectives seen like torch.distributed's: recorded for the hang watch, checked in debug mode.

DTensor (``full_tensor()``, ``redistribute``), FSDP2's state dicts, tensor parallel and code made by
``torch.compile`` (dynamo turns ``dist.all_reduce`` into one) do not call ``torch.distributed.all_reduce`` and
the like: they call the ops ``torch.ops._c10d_functional.*``, which launch the collective and return at once,
and ``wait_tensor`` on the result, where the rank really waits. Those ops are caught at the dispatcher: in the
rank's process only, a kernel of ours is registered for the CPU and CUDA keys (``torch.library``), above the
op's own ``CompositeExplicitAutograd`` kernel, which ours then calls. So every caller is seen, eager Python and
compiled code alike (the compiled graph calls the same ops; tracing itself runs on fake tensors and never
reaches these keys). Wrapping ``_functional_collectives``' Python functions would miss compiled code, and a
``TorchDispatchMode`` would have to be pushed on every thread and would change what dynamo traces.

Each launch is recorded as ``functional <collective>`` (``FSDP <collective>`` when FSDP called it) and, in
debug mode, checked first by the same one-row all_gather as every collective (``ops.check_agreement``), so a
mismatch raises ``DistributedOperationException`` on every rank before the backend sees it. Its
``wait_tensor`` is recorded as waiting in that collective ("functional all_reduce #3 (async, in its wait())").
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from . import context
from .agreement import detail_of, stable_code
from .collectives import _collective, call_site, debug_mode_enabled

# op -> (the collective it is checked and named as, what must agree)
_OPS = {
    "all_reduce": ("all_reduce", "shape"), "all_reduce_": ("all_reduce", "shape"),
    "all_reduce_coalesced": ("all_reduce_coalesced", "op"), "all_reduce_coalesced_": ("all_reduce_coalesced", "op"),
    "all_gather_into_tensor": ("all_gather_into_tensor", "shape"),
    "all_gather_into_tensor_out": ("all_gather_into_tensor", "shape"),
    "all_gather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", "op"),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", "shape"),
    "reduce_scatter_tensor_out": ("reduce_scatter_tensor", "shape"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", "op"),
    "all_to_all_single": ("all_to_all_single", "shape"),
    "broadcast": ("broadcast", "shape"), "broadcast_": ("broadcast", "shape"),
}
_SHORT = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
          "all_gather_into_tensor_coalesced": "all_gather_coalesced",
          "reduce_scatter_tensor_coalesced": "reduce_scatter_coalesced"}  # (the record keeps 32 bytes of a name)
FUNCTIONAL_MODULE = "torch.distributed._functional_collectives"  # imported by DTensor, FSDP2 and dynamo
_KEYS = ("CPU", "CUDA")
_library = None  # the torch.library.Library holding our kernels, once installed
_launched: dict = {}  # storage address of a launched collective's output -> (number, name, members)
_lock = threading.Lock()


def install() -> None:
    """In a launched worker: every functional collective and its wait go through ``_kernel``/``_wait``."""
    global _library
    if _library is not None or not hasattr(torch.ops, "_c10d_functional"):
        return
    library = torch.library.Library("_c10d_functional", "IMPL")  # kernels for the existing ops
    namespace = torch.ops._c10d_functional
    for name in [*_OPS, "wait_tensor"]:
        try:
            op = getattr(namespace, name).default
        except (AttributeError, RuntimeError):  # (an op this torch lacks)
            continue
        kernel = _wait(op) if name == "wait_tensor" else _kernel(name, op)
        for key in _KEYS:
            if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):  # an own kernel: left alone
                library.impl(name, kernel, key)
    _library = library


def _original(op):
    """The op's own kernel, below ours."""
    key = torch._C.DispatchKey.CompositeExplicitAutograd
    return lambda *args, **kwargs: op._op_dk(key, *args, **kwargs)


def _kernel(name: str, op):
    """The kernel for collective ``name``: recorded, checked in debug mode, then launched by the op's own."""
    original = _original(op)
    checked, rule = _OPS[name]
    names = [argument.name for argument in op._schema.arguments]
    operation = f"torch.ops._c10d_functional.{checked}"
    shown = f"functional {_SHORT.get(checked, checked)}"

    def collective(*args, **kwargs):
        if context.current.progress is None and not debug_mode_enabled():
            return original(*args, **kwargs)
        bound = {**dict(zip(names, args)), **kwargs}
        group = bound["group_name"]  # (a name, or in newer torch the group itself)
        if not isinstance(group, dist.ProcessGroup):
            group = dist.distributed_c10d._resolve_process_group(group)
        subject = bound.get("input", bound.get("inputs"))
        rule_here = rule
        if checked == "all_to_all_single" and (bound.get("output_split_sizes") or bound.get("input_split_sizes")):
            rule_here = "dtype"  # uneven splits: shapes may differ by design
        reduce_op = bound.get("reduce_op")
        detail = stable_code(reduce_op) + 1 if reduce_op is not None else detail_of(bound)
        with _collective(operation, subject, rule_here, group, name=shown, detail=detail) as exchange:
            output = original(*args, **kwargs)
            if exchange.outer and exchange.progress is not None:
                entry = (exchange.progress.sequence_of(exchange.slot), exchange.name, exchange.members)
                for tensor in output if isinstance(output, (list, tuple)) else (output,):
                    _remember(tensor, entry)
            return output

    collective.__name__ = name
    return collective


def _remember(tensor, entry) -> None:
    with _lock:
        if len(_launched) > 4096:  # outputs nobody waited for (a wait that never came): forgotten
            _launched.clear()
        _launched[_address(tensor)] = entry


def _address(tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _wait(op):
    """``wait_tensor``: where the rank waits for a functional collective, recorded as waiting in it."""
    original = _original(op)

    def wait_tensor(tensor):
        progress = context.current.progress
        if progress is None or not _launched:
            return original(tensor)
        with _lock:
            entry = _launched.pop(_address(tensor), None)
        if entry is None:
            return original(tensor)
        sequence, name, members = entry
        slot = progress.enter_wait(sequence, name, call_site(), members)
        try:
            return original(tensor)
        finally:
            progress.leave_wait(slot, sequence)

    return wait_tensor

