"""Collectives for training code, and debug mode: ranks that disagree fail at once instead of hanging.

``gather``, ``gather_object``, ``broadcast``, ``broadcast_object_list``, ``reduce`` and ``pad_across_processes``
work like Accelerate's, in our workers and in any process group (torchrun included).

Debug mode (``notebook_launcher(..., debug=True)``, or ``ACCELERATE_DEBUG_MODE`` set to 1/true/yes/on/y/t, or
``debug: true`` in an Accelerate config file) checks before every collective that all ranks agree on the
operation, the shapes and the dtypes. The check is one small fixed-size all_gather of integers (no pickling). On
disagreement every rank raises ``DistributedOperationException`` at once, with the message users of Accelerate
know::

    Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid.

    Operation: `notebook_launcher.ops.broadcast`
    Input shapes:
      - Process 0: [1, 5]
      - Process 1: [1, 2, 5]

In a launched worker (after ``install()``) the raw ``torch.distributed`` collectives are checked too (so
Accelerate's own ops and library code are covered), and each collective records where the rank is (for hang
diagnosis), debug mode or not; FSDP's are recorded as ``FSDP <collective>``. They are caught at the function
object (``intercept``), so a name imported before the launch (``from torch.distributed import all_reduce``),
``distributed_c10d.all_reduce`` and a ``functools.partial`` of one all count (the outermost collective is the
one recorded and checked: an object collective's inner ``all_gather`` is not). What the ranks compare, and the
messages, live in ``agreement``; ``any_rank`` is the one collective other modules build on (``check_trigger``).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading

import torch
import torch.distributed as dist

from ..schema.error_base import NotebookLauncherError
from ..schema.events import SHAPE_MISMATCH, TRUE_VALUES
from . import context, work_watch
from .agreement import OPERATIONS, RAW_COLLECTIVES, Rows, detail_of, mismatch, signature, stable_code
from .carry import can_finish_from_carried, finish_from_carried
from .intercept import intercept, is_intercepted, own_functions

CARRY_BYTES = 1024  # debug mode: tensors up to this size travel with the agreement check (one round, not two)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
# the raw collectives this torch has (torch's own functions, found behind a user's wrapper or partial); after
# install(), untouched copies of them, which our own ops call. HIDDEN: those behind something that does not lead
# to torch's function (called as they are, neither recorded nor checked; torch_names.missing() says so)
_raw, HIDDEN = own_functions(RAW_COLLECTIVES, (dist.distributed_c10d, dist), _TORCH_DIR)
_INTERCEPTED = {name: function for name, function in _raw.items() if name not in HIDDEN}  # what install() hooks
_FLAT_GATHER = "all_gather_single" if "all_gather_single" in _raw else "all_gather_into_tensor"  # newer name first
_state = threading.local()  # .inside: a collective is in progress on this thread (nested calls are not checked)


class DistributedOperationException(NotebookLauncherError):
    """Ranks called a collective with different shapes, dtypes or operations (raised on every rank)."""

    raised_on_every_rank = True


def debug_mode_enabled() -> bool:
    """The launch's ``debug=`` in its workers, else ``ACCELERATE_DEBUG_MODE`` read now (a function may set it)."""
    if context.current.debug is not None:
        return context.current.debug
    return os.environ.get("ACCELERATE_DEBUG_MODE", "").strip().lower() in TRUE_VALUES


# -- the public ops ----------------------------------------------------------------------------------------------
def _each_tensor(operation):
    """``operation`` applied to every tensor of nested lists, tuples and dicts, keeping their types."""
    @functools.wraps(operation)
    def nested(data, *args, **kwargs):
        if isinstance(data, (list, tuple)):
            return type(data)(nested(item, *args, **kwargs) for item in data)
        if isinstance(data, dict):
            return type(data)({key: nested(item, *args, **kwargs) for key, item in data.items()})
        return operation(data, *args, **kwargs)

    return nested


@_each_tensor
def gather(tensor):
    """Every rank's ``tensor`` concatenated along the first dimension (nested lists/tuples/dicts too)."""
    if not _distributed():
        return tensor
    with _collective("notebook_launcher.ops.gather", tensor, "shape", carry=True) as exchange:
        if exchange.carried is not None:  # debug mode: the tensors came with the check, in the same round
            carried = exchange.carried  # (world_size, *shape), a view of the check's rows: copied here
            return carried.clone(memory_format=torch.contiguous_format).view(
                (carried.shape[0] * (tensor.shape[0] if tensor.ndim else 1),) + tuple(tensor.shape[1:]))
        if tensor.ndim == 0:
            tensor = tensor[None]
        output = torch.empty((dist.get_world_size() * tensor.shape[0],) + tuple(tensor.shape[1:]),
                             dtype=tensor.dtype, device=tensor.device)
        _raw[_FLAT_GATHER](output, tensor.contiguous())
        return output


def gather_object(obj):
    """Every rank's ``obj`` (lists are flattened, as in Accelerate)."""
    if not _distributed():
        return obj if isinstance(obj, list) else [obj]
    with _collective("notebook_launcher.ops.gather_object", None, "op"):
        gathered = [None] * dist.get_world_size()
        _raw["all_gather_object"](gathered, obj)
    if all(isinstance(item, list) for item in gathered):
        return [element for item in gathered for element in item]
    return gathered


@_each_tensor
def broadcast(tensor, from_process: int = 0):
    """``tensor`` from rank ``from_process`` on every rank (in place; also returned)."""
    if not _distributed():
        return tensor
    carry = isinstance(from_process, int) and 0 <= from_process < dist.get_world_size()  # else torch's own error
    with _collective("notebook_launcher.ops.broadcast", tensor, "shape", carry=carry,
                     detail=from_process if isinstance(from_process, int) else stable_code(from_process)) as exchange:
        if exchange.carried is not None:  # debug mode: rank from_process's tensor came with the check
            with torch.no_grad():
                tensor.copy_(exchange.carried[from_process])
        else:
            _raw["broadcast"](tensor, src=from_process)
    return tensor


def broadcast_object_list(object_list: list, from_process: int = 0) -> list:
    """The list of rank ``from_process`` on every rank (in place; also returned)."""
    if not _distributed():
        return object_list
    with _collective("notebook_launcher.ops.broadcast_object_list", object_list, "op", detail=from_process):
        _raw["broadcast_object_list"](object_list, src=from_process)
    return object_list


_REDUCTIONS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
               "min": dist.ReduceOp.MIN}


def reduce(tensor, reduction: str = "sum", scale: float = 1.0):
    """A new tensor with ``tensor`` reduced over the ranks: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not one of 'sum', 'mean', 'max', 'min'")
    return _reduce(tensor, reduction, scale)


@_each_tensor
def _reduce(tensor, reduction: str, scale: float):
    result = tensor.clone()
    if _distributed():
        with _collective("notebook_launcher.ops.reduce", tensor, "shape", detail=list(_REDUCTIONS).index(reduction)):
            _raw["all_reduce"](result, op=_REDUCTIONS[reduction])
        if reduction == "mean":
            result = result / dist.get_world_size()
    return result * scale if scale != 1.0 else result


@_each_tensor
def pad_across_processes(tensor, dim: int = 0, pad_index=0, pad_first: bool = False):
    """``tensor`` padded along ``dim`` to the largest size any rank has, so it can be gathered."""
    if not _distributed():
        return tensor
    with _collective("notebook_launcher.ops.pad_across_processes", tensor, "dtype", detail=dim):
        if dim >= tensor.ndim or dim < -tensor.ndim:  # (after the check: in debug mode ranks agree on ndim)
            return tensor
        size = torch.tensor([tensor.shape[dim]], device=tensor.device)
        _raw["all_reduce"](size, op=dist.ReduceOp.MAX)
    largest = int(size.item())
    if largest == tensor.shape[dim]:
        return tensor
    new_shape = list(tensor.shape)
    new_shape[dim] = largest
    padded = tensor.new_full(new_shape, pad_index)
    index = [slice(None)] * tensor.ndim
    index[dim] = slice(largest - tensor.shape[dim], largest) if pad_first else slice(0, tensor.shape[dim])
    padded[tuple(index)] = tensor
    return padded


def any_rank(flag: bool, operation: str) -> bool:
    """True on every rank if ``flag`` is true on any: one all_reduce of one number, shown in hang diagnosis and
    checked in debug mode as ``operation`` (a name in ``agreement.OPERATIONS``). Outside a process group: ``flag``."""
    if operation not in OPERATIONS:
        raise ValueError(f"{operation!r} is not in notebook_launcher.rank.agreement.OPERATIONS: add it there")
    if not _distributed():
        return bool(flag)
    value = torch.tensor([1 if flag else 0], device=_check_device())
    with _collective(operation, None, "op"):
        _raw["all_reduce"](value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# -- the check ---------------------------------------------------------------------------------------------------
class _collective:
    """Around one collective: records progress, checks agreement in debug mode, marks nested calls.

    ``carry``: the caller can finish the operation from every rank's tensor, so in debug mode a small tensor
    travels with the check (``.carried``: every rank's tensor, stacked) and the operation costs no second round.
    """

    def __init__(self, operation: str, subject, rule: str, group=None, site: str | None = None,
                 carry: bool = False, detail: int = 0, name: str | None = None):
        self.operation, self.subject, self.rule, self.group, self.site = operation, subject, rule, group, site
        self.carry, self.detail, self.given_name = carry, detail, name
        self.carried = None

    def __enter__(self):
        self.outer = not getattr(_state, "inside", False)
        if not self.outer:
            return self
        _state.inside = True
        site = self.site
        self.progress = progress = context.current.progress
        if progress is not None:
            site = site or call_site()
            name = self.operation.rsplit(".", 1)[-1]
            self.name = f"FSDP {name}" if _called_by_fsdp() else self.given_name or name
            self.members = work_watch.group_members(self.group)
            self.slot = progress.enter(self.name, site, members=self.members)
        try:
            if debug_mode_enabled():
                self.carried = check_agreement(self.operation, self.subject, self.rule, self.group, site,
                                               carry=self.carry, detail=self.detail)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info):
        if self.outer:
            _state.inside = False
            if self.progress is not None:
                self.progress.leave(slot=self.slot)
        return False

    def launched(self, work):
        """``work``, what the collective returned with ``async_op=True``: its wait is recorded as waiting in
        this collective (``work_watch``). Returns ``work``."""
        if self.outer and self.progress is not None and work is not None:
            work_watch.launched(work, self.progress.sequence_of(self.slot), self.name, self.members)
        return work


def set_inside(inside: bool) -> bool:
    """Mark this thread as inside a collective recorded elsewhere (DDP's, by ``ddp_watch``): the raw collectives
    it calls meanwhile are neither recorded nor checked. Returns the previous mark, to restore."""
    outer = getattr(_state, "inside", False)
    _state.inside = inside
    return outer


def check_agreement(operation: str, subject, rule: str, group=None, site: str | None = None, carry: bool = False,
                    detail: int = 0):
    """One all_gather of a fixed-size integer row per rank; raises DistributedOperationException on every rank
    if the rows differ.

    With ``carry`` and a small tensor (up to CARRY_BYTES), the row also carries the tensor's bytes, and every
    rank's tensor is returned, stacked (a view into this thread's rows: valid until its next check, so the
    caller copies from it at once); otherwise None. ``site``: the caller's line, found here only on a mismatch.
    """
    world_size = dist.get_world_size(group)
    row = signature(operation, subject, rule, detail)
    device = _check_device(group)
    rows = _rows(world_size, device)
    nbytes = subject.numel() * subject.element_size() if isinstance(subject, torch.Tensor) else 0
    can_carry = (carry and rule == "shape" and isinstance(subject, torch.Tensor) and nbytes <= CARRY_BYTES
                 and subject.layout == torch.strided and subject.device == device)
    row[-1] = int(can_carry)
    if row != rows.written:  # (a loop calls with the same row again and again: written once)
        rows.head[:len(row)] = row  # the same size on every rank: fixed
        rows.written = row
    if can_carry:
        mine, every = rows.views(subject.dtype, subject.shape, nbytes)
        mine.copy_(subject.detach() if subject.requires_grad else subject)
    _gather_rows(rows, device, group)
    heads = rows.heads.tolist()
    first = heads[0][:-1]
    if all(head[:-1] == first for head in heads):
        if not all(head[-1] for head in heads):  # every rank decides alike: carry only if all of them can
            return None
        return every
    rows = [head[:len(row) - 1] for head in heads]
    sites = [None] * world_size
    _raw["all_gather_object"](sites, site or call_site(), group=group)  # the slow path: we fail anyway
    report = mismatch(operation, rows, sites)
    emit = context.current.emit
    if emit is not None and dist.get_rank(group) == 0:
        emit(SHAPE_MISMATCH, report)
    raise DistributedOperationException(report["message"])


def _rows(world_size: int, device) -> Rows:
    kept = getattr(_state, "rows", None)  # this thread's rows (see agreement.Rows)
    if kept is None:
        kept = _state.rows = {}
    if (world_size, device) not in kept:
        kept[(world_size, device)] = Rows(world_size, device, CARRY_BYTES)
    return kept[(world_size, device)]


def _gather_rows(rows: Rows, device, group) -> None:
    """The check's all_gather of every rank's row into ``rows.table``, straight to the process group where it
    can: torch's public function (its checks, its logger, its dispatch) was a tenth of a checked call here."""
    mine = rows.mine if device.type == "cpu" else rows.mine.to(device)
    process_group = group or dist.distributed_c10d._get_default_group()
    gather = getattr(process_group, "all_gather_single", None) or getattr(process_group, "_allgather_base", None)
    coalescing = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_coalesce_state", None)
    if gather is None or _ALLGATHER_OPTIONS is None or coalescing is None or process_group in coalescing:
        _raw[_FLAT_GATHER](rows.table.view(-1), mine, group=group)
        return
    work = gather(rows.table.view(-1), mine, _ALLGATHER_OPTIONS)
    if work is not None:
        work.wait()


def _allgather_options():
    """Options for a blocking all_gather, as torch's own function makes them (None where this torch has none)."""
    options_type = getattr(dist.distributed_c10d, "AllgatherOptions", None)
    if options_type is None:
        return None
    options = options_type()
    options.asyncOp = False
    return options


_ALLGATHER_OPTIONS = _allgather_options()
_CHECK_DEVICES: dict = {}  # process group -> where its check rows live


def _check_device(group=None):
    """Where the check row lives: what the group's backend can move (CUDA for nccl, else the CPU)."""
    key = group or dist.distributed_c10d._get_default_group()  # (a default group made anew is a new key)
    known = _CHECK_DEVICES.get(key)
    if known is not None and (known.type == "cpu" or known.index == torch.cuda.current_device()):
        return known
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in str(dist.get_backend(group)) \
        else torch.device("cpu")
    if len(_CHECK_DEVICES) > 16:
        _CHECK_DEVICES.clear()
    _CHECK_DEVICES[key] = device
    return device


def call_site() -> str:
    """file:line in function of the first frame outside torch and this package: the user's line."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith(_OWN_DIR) or filename.startswith(_TORCH_DIR) or _generated(filename)
                or f"{os.sep}accelerate{os.sep}" in filename or filename.startswith("<frozen")):
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _generated(filename: str) -> bool:
    """Code torch.compile made (an FX graph's, inductor's output): the user's line is further out."""
    return filename.startswith("<eval_with_key>") or "torchinductor_" in filename


def _called_by_fsdp() -> bool:
    """Whether FSDP (torch.distributed.fsdp, FSDP1 or fully_shard) called the collective being entered: the
    progress record names it "FSDP <collective>"."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_FSDP_DIR):
            return True
        if not (filename.startswith(_OWN_DIR) or filename.startswith(_TORCH_DIR)):
            return False  # the user's frame: no FSDP between it and the collective
        frame = frame.f_back
    return False


_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package
_FSDP_DIR = os.path.join(_TORCH_DIR, "distributed", "fsdp") + os.sep


# -- the raw collectives in a worker -----------------------------------------------------------------------------
def install() -> None:
    """In a launched worker: torch.distributed's collectives record where the rank is (``context.current``'s
    progress) and, in debug mode, check agreement first, a mismatch going to its writer as an event. Each is
    caught at its function object, however the code reaches it; our own ops call the untouched copies. A
    user's wrapper put in a collective's place is left as it is: it runs, and reaches the hooked function. A wait
    for an async collective's work is recorded too (``work_watch``)."""
    work_watch.install(call_site)
    for name, function in _INTERCEPTED.items():
        if not is_intercepted(function):  # (_raw holds the copies once installed)
            _raw[name] = intercept(function, functools.partial(_wrapped, name, argument=RAW_COLLECTIVES[name][0],
                                                               rule=RAW_COLLECTIVES[name][1]))


def _wrapped(name: str, original, argument: str | None, rule: str):
    """The hook ``intercept`` calls instead of collective ``name`` (``original``: the untouched copy)."""
    parameters = inspect.signature(original)
    names = [p.name for p in parameters.parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    plain = len(names) == len(parameters.parameters)  # then arguments map to names without inspect's binding

    @functools.wraps(original)
    def collective(*args, **kwargs):
        if getattr(_state, "inside", False):
            return original(*args, **kwargs)
        if plain and len(args) <= len(names) and not kwargs.keys() - names[len(args):]:
            bound = {**dict(zip(names, args)), **kwargs}
        else:
            try:
                bound = parameters.bind_partial(*args, **kwargs).arguments
            except TypeError:  # arguments torch refuses: its own error, as without the hook
                return original(*args, **kwargs)
        group = bound.get("group")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            return original(*args, **kwargs)  # group="junk": torch's own error (nothing to record or check)
        if group is not None and dist.distributed_c10d._rank_not_in_group(group):
            return original(*args, **kwargs)  # not a member: a no-op for this rank, in torch too
        subject = bound.get(argument) if argument else None
        if name == "all_to_all_single" and (bound.get("input_split_sizes") or bound.get("output_split_sizes")):
            rule_here = "dtype"  # uneven splits: shapes may differ by design
        elif name == "all_gather" and isinstance(subject, torch.Tensor) and subject.device.type == "cpu":
            rule_here = "shape"  # uneven sizes are for NCCL and the like: gloo aborts the process on them
        else:
            rule_here = rule
        carry = debug_mode_enabled() and can_finish_from_carried(name, bound, subject, group)
        with _collective(f"torch.distributed.{name}", subject, rule_here, group, carry=carry,
                         detail=detail_of(bound)) as exchange:
            # torch's own checks come after the agreement check: a call torch refuses on every rank raises torch's
            # own error here; only a result the carried tensors give exactly as torch would is finished from them
            if exchange.carried is not None and finish_from_carried(name, bound, exchange.carried):
                return None
            return exchange.launched(original(*args, **kwargs))

    return collective

