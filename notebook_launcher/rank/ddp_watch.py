"""DDP's own collectives in the rank's progress record, so a hang inside DDP says where it is.

``torch.nn.parallel.DistributedDataParallel`` runs its collectives in C++ (the reducer's gradient all_reduce in
backward, the buffer broadcast in forward), out of sight of the Python-level hooks of ``collectives.install``. In a
launched worker, ``install()`` makes every DDP model made afterwards report them, without changing what
DDP computes or how, and without running any Python inside the backward on most steps (a Python hook inside
the autograd engine costs a small model several percent of its step):

- **Gradients**: a forward that will synchronize gradients arms the model; the next backward (torch's one
  entry to the autograd engine, ``_engine_run_backward``, wrapped where ``torch.autograd.backward`` looks it
  up, in ``torch.autograd``; from Python, outside the engine) is its step: the record's DDP slot says
  ``"DDP gradient all_reduce"``, the model's step and the user's line (their ``loss.backward()``) from the
  moment the backward starts until it returns, which is after DDP's own ``finalize_backward`` has waited for
  every bucket's all_reduce (the kernel sees the slot's sequence number move: progress). So a rank is
  "inside" from the start of its backward through the model until DDP has all the averaged gradients;
  blocked there, the record says so. ``step`` counts the model's synchronized backward passes (1 for the
  first; ``no_sync()`` passes do not count). ``torch.autograd.grad`` (which accumulates no gradient, so DDP
  reduces nothing) and a backward inside one (a reentrant checkpoint's) are not steps.
- **The wait, sampled**: how much of a step's backward was waiting for the others (for the run's balance) is
  measured on sampled steps only, with a hook on the forward's output and two callbacks queued on the autograd
  engine: the second runs after DDP's ``finalize_backward``, and the time between the two is the wait (on
  CUDA, where DDP's wait only queues the all_reduce, the time between two CUDA events recorded there, read
  once the GPU has passed them). A step is sampled when its number is a multiple of the model's period, a
  power of two (1 to 64) chosen from the rank's step time so that the hooks cost under 0.25% of it (1 while
  steps take 40 ms or more); powers of two nest, so ranks whose periods differ still share every step that
  the longest period samples. The backward's end ends the rank's step for ``balance_meter`` (the first DDP
  model's, when a rank trains several).
- **A comm hook** (``model.register_comm_hook``, built-in hooks, ``mixed_precision``): DDP calls it as it
  would and uses its result; the record covers the backward around it. A Python hook is registered wrapped
  in a function of the same name and signature that marks the raw collectives it calls (such as
  ``allreduce_hook``'s all_reduce) as inside DDP's, so they are neither recorded nor checked on their own
  and the record keeps saying where the rank waits. (A Python comm hook of our own was the other way to see
  the buckets; torch's ``allreduce_hook`` alone made a small model's step ~13% slower than DDP's C++
  path.)
- **Buffers**: DDP's buffer broadcast (models with buffers, e.g. BatchNorm) is recorded as
  ``"DDP buffer broadcast"`` around ``_sync_buffers``, at the user's ``model(x)`` line, with the step of the
  backward to come.
- **Construction**: ``DistributedDataParallel(model)`` checks the parameters' shapes across ranks and
  broadcasts rank 0's parameters and buffers: ``"DDP parameter broadcast"`` (step 0) at the user's line, around
  those two collectives only (the rest of the construction, such as torch's first import of ``torch._dynamo``,
  about 1.5 s, is the rank's own work).
- **Uneven inputs**: a rank that has joined (``with model.join():``) and shadows the others' collectives is
  in ``"DDP join"`` while it does.

Limits: the first ``backward()`` after a synchronizing forward is taken for that model's (with two DDP models,
a GAN's, the first backward after both forwards counts for both); the wait is measured where the loss depends
on a tensor the model returns directly or in a tuple, list or dict (``ModelOutput`` included), one level deep
(other outputs: the step is recorded, its wait is not); "inside" covers the backward's own computation
through the model too (the record cannot tell it from the wait); torch before 2.3 has no
``_engine_run_backward``: there DDP's backward is not recorded. The raw
torch.distributed collectives DDP runs from Python inside these are not recorded or checked again by ``collectives``.
``NOTEBOOK_LAUNCHER_DDP_WATCH=0`` (or false/no/off) in the environment before the launch leaves DDP untouched.
"""

from __future__ import annotations

import functools
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel import distributed as _ddp_module
from torch.nn.parallel.distributed import _DDPJoinHook

from ..schema.progress_record import DDP_GRADIENTS
from . import balance_meter, context
from .collectives import call_site, set_inside
from .work_watch import group_members

ENV_VAR = "NOTEBOOK_LAUNCHER_DDP_WATCH"
GRADIENTS = DDP_GRADIENTS
BUFFERS = "DDP buffer broadcast"
PARAMETERS = "DDP parameter broadcast"
JOIN = "DDP join"
HOOK_COST_S = 100e-6  # what a sampled step's hook and callbacks cost at most (about 50 µs on this CPU)
HOOK_SHARE = 0.0025  # ...as a share of the step at most, which sets the sampling period
MAX_PERIOD = 64
_ATTRIBUTE = "_notebook_launcher_watch"
_BACKWARD = "_engine_run_backward"
_OFF_VALUES = ("0", "false", "no", "off", "n", "f")
_engine = torch.autograd.Variable._execution_engine
_originals: dict = {}
_armed: list = []  # the watches whose synchronizing forward ran and whose backward has not started
_in_backward = False  # inside a backward this module recorded (one nested in it is not another step)


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in _OFF_VALUES


def install() -> bool:
    """Every DDP model made from now on in this process reports its collectives to the rank's progress record
    (``context.current.progress``); False (and nothing changed) when ``NOTEBOOK_LAUNCHER_DDP_WATCH`` turns it off
    or the rank has no record."""
    if not enabled() or context.current.progress is None:
        return False
    if not _originals:
        for owner, name, replacement in _PATCHES:
            if name in owner.__dict__:  # (torch before 2.3 has no _engine_run_backward: DDP's backward unseen)
                _originals[name] = owner.__dict__[name]
                setattr(owner, name, replacement)
    return True


def uninstall() -> None:
    """DDP as torch has it; models made while it was installed record nothing more."""
    global _in_backward
    for owner, name, _ in _PATCHES:
        if name in _originals:
            setattr(owner, name, _originals.pop(name))
    _in_backward = False
    _armed.clear()


def record():
    """The rank's progress record while DDP is watched (installed), else None."""
    return context.current.progress if _originals else None


class _Watch:
    """One DDP model's side of the record: its step, its sampling period, the wait of its sampled steps."""

    __slots__ = ("step", "period", "step_time", "ended_at", "ended_step", "sampled", "hooked", "reducing_since",
                 "wait", "on_cuda", "gpu_waits", "members")

    def __init__(self, model):
        self.members = group_members(getattr(model, "process_group", None))  # its group, for the record
        self.step = 0
        self.period = 1  # steps sampled: the multiples of this (1 until the step time is known)
        self.step_time = 0.0  # seconds per step, smoothed over the sampled steps
        self.ended_at, self.ended_step = 0.0, -1  # when the last step noted for the meter ended, and its number
        self.sampled = False  # the step to come is sampled (its forward hooked its output)
        self.hooked = False  # ...and its backward has not reached the hook yet
        self.reducing_since = 0.0  # when the backward's own computation ended and DDP's wait began
        self.wait: float | None = None  # the sampled step's wait, once its second callback ran (CPU)
        self.on_cuda = any(p.device.type == "cuda" for p in model.parameters())
        # on CUDA, DDP's wait returns once the all_reduce is queued: the GPU's own clock times the wait, between
        # two events on the stream that waits for it ([start, end, the step's balance record], oldest first)
        self.gpu_waits: list = []

    def after_forward(self, model, output) -> None:
        if not (model.require_backward_grad_sync and torch.is_grad_enabled()):
            return  # no_sync(), eval: no collective in backward
        if (self.step + 1) % self.period == 0:  # a sampled step: its wait is measured, where the output shows
            tensors = output.values() if isinstance(output, dict) else output \
                if isinstance(output, (list, tuple)) else (output,)
            for tensor in tensors:
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(self.backward_starts)
                    self.sampled = self.hooked = True
        if self not in _armed:
            _armed.append(self)

    def backward_starts(self, grad) -> None:
        if self.hooked:  # (not again for another output of the same forward)
            self.hooked = False
            _engine.queue_callback(self.after_ddp_queued)  # runs before DDP's finalize_backward, queued later...

    def after_ddp_queued(self) -> None:
        self.reducing_since = time.monotonic()
        if self.on_cuda:
            self.gpu_waits.append([_cuda_event(), None, None])
        _engine.queue_callback(self.wait_ended)  # ...so this one runs after it: every bucket is reduced then

    def wait_ended(self) -> None:
        if self.on_cuda:
            if self.gpu_waits and self.gpu_waits[-1][1] is None:
                self.gpu_waits[-1][1] = _cuda_event()
        else:
            self.wait = time.monotonic() - self.reducing_since

    def step_ended(self) -> None:
        """Its backward returned, and it was sampled or is the step before one (the origin of the sampled
        step's duration): to the balance meter; the step time, from two such steps in a row, sets the
        sampling period."""
        sampled, self.sampled = self.sampled, False
        now = time.monotonic()
        wait, self.wait = self.wait, None
        if self.ended_step == self.step - 1 and self.ended_at:
            duration = now - self.ended_at
            self.step_time = duration if not self.step_time else 0.8 * self.step_time + 0.2 * duration
            needed = HOOK_COST_S / (HOOK_SHARE * self.step_time) if self.step_time > 0 else MAX_PERIOD
            self.period = 1
            while self.period < needed and self.period < MAX_PERIOD:
                self.period *= 2
        self.ended_at, self.ended_step = now, self.step
        if self.on_cuda:
            self.gpu_waits_completed()  # (before the meter may send the records they belong to)
        record = balance_meter.step_done(balance_meter.DDP_STEPS, self.step, owner=self,
                                         ddp_wait=wait if sampled else None)
        if self.on_cuda and sampled and self.gpu_waits and self.gpu_waits[-1][2] is None:
            self.gpu_waits[-1][2] = record or []

    def gpu_waits_completed(self) -> None:
        """The GPU waits that have completed, to the records of their steps (the newest may complete later)."""
        # a wait whose end was never recorded (its backward raised) is dropped once a newer one exists
        self.gpu_waits[:-1] = [wait for wait in self.gpu_waits[:-1] if wait[1] is not None]
        while self.gpu_waits and self.gpu_waits[0][1] is not None and self.gpu_waits[0][1].query():
            start, end, record = self.gpu_waits.pop(0)
            balance_meter.ddp_wait_known(record, start.elapsed_time(end) / 1000.0)
        del self.gpu_waits[:-64]  # never completed (a device error): not kept forever


def _cuda_event():
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _run_backward(t_outputs, *args, **kwargs):
    """torch's entry to the autograd engine: the backward of armed DDP models is their gradient all_reduce.
    Not ``torch.autograd.grad`` (it accumulates no gradient: DDP reduces nothing), nor a backward inside one
    (a reentrant checkpoint's)."""
    global _in_backward
    progress = record()
    if not _armed or progress is None or _in_backward or kwargs.get("accumulate_grad") is False:
        return _originals[_BACKWARD](t_outputs, *args, **kwargs)
    watches = _armed.copy()
    _armed.clear()
    for watch in watches:
        watch.step += 1
    first = watches[0]
    if first.sampled:
        progress.ddp_site(call_site())  # the user's loss.backward(), on sampled steps only (it costs)
    entered = progress.enter_ddp(first.step, first.members)
    _in_backward = True
    try:
        return _originals[_BACKWARD](t_outputs, *args, **kwargs)
    finally:
        _in_backward = False
        progress.leave_ddp(entered)
        try:
            for watch in watches:  # most steps: nothing more (neither sampled nor the step before one)
                if watch.sampled or (watch.step + 1) % watch.period == 0:
                    watch.step_ended()
        except Exception:  # noqa: BLE001 - the balance's figures (a device error, the kernel gone) never
            pass  # replace what the backward itself returned or raised


def _init(self, *args, **kwargs):
    _originals["__init__"](self, *args, **kwargs)
    if record() is not None and dist.is_initialized():
        self.__dict__[_ATTRIBUTE] = _Watch(self)


def _construction_collective(name: str):
    """DDP's construction calls these two collectives (``torch.distributed.utils``) by their names in its module:
    each is recorded as the parameter broadcast, the rest of the construction as the rank's own work."""

    position = 0 if name == "_verify_param_shape_across_processes" else 1  # where each takes process_group

    def collective(*args, **kwargs):
        if record() is None:
            return _originals[name](*args, **kwargs)
        group = kwargs.get("process_group", args[position] if len(args) > position else None)
        with _Inside(PARAMETERS, 0, group):
            return _originals[name](*args, **kwargs)

    return collective


def _register_comm_hook(self, state: object, hook) -> None:
    if record() is None or not callable(hook):
        return _originals["register_comm_hook"](self, state, hook)

    @functools.wraps(hook)  # DDP checks the hook's name and signature
    def inside_ddp(state, bucket):
        outer = set_inside(True)
        try:
            return hook(state, bucket)
        finally:
            set_inside(outer)

    return _originals["register_comm_hook"](self, state, inside_ddp)


def _post_forward(self, output):
    output = _originals["_post_forward"](self, output)
    watch = self.__dict__.get(_ATTRIBUTE)
    if watch is not None and record() is not None:
        watch.after_forward(self, output)
    return output


def _sync_buffers(self):
    watch = self.__dict__.get(_ATTRIBUTE)
    if watch is None or record() is None:
        return _originals["_sync_buffers"](self)
    with _Inside(BUFFERS, watch.step + 1, self.process_group):  # before the backward of the coming step
        return _originals["_sync_buffers"](self)


def _join_main_hook(self):
    watch = self.ddp.__dict__.get(_ATTRIBUTE)
    if watch is None or record() is None:
        return _originals["main_hook"](self)
    with _Inside(JOIN, watch.step, self.ddp.process_group):
        return _originals["main_hook"](self)


class _Inside:
    """In one of DDP's collectives (run from Python): recorded at the user's line; the raw collectives it
    calls are not recorded again."""

    def __init__(self, operation: str, step: int, group=None):
        self.operation, self.step, self.group = operation, step, group

    def __enter__(self):
        self.progress = record()
        self.slot = self.progress.enter(self.operation, call_site(), self.step, group_members(self.group))
        self.outer = set_inside(True)

    def __exit__(self, *exc_info):
        set_inside(self.outer)
        self.progress.leave(slot=self.slot)
        return False


_PATCHES = ((DistributedDataParallel, "__init__", _init), (DistributedDataParallel, "_post_forward", _post_forward),
            (DistributedDataParallel, "register_comm_hook", _register_comm_hook),
            (DistributedDataParallel, "_sync_buffers", _sync_buffers), (_DDPJoinHook, "main_hook", _join_main_hook),
            (torch.autograd, _BACKWARD, _run_backward),  # torch.autograd.backward and .grad look it up there
            *((_ddp_module, name, _construction_collective(name))
              for name in ("_verify_param_shape_across_processes", "_sync_module_states")))
