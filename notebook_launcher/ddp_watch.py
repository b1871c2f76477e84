"""DDP's own collectives in the rank's progress record, so a hang inside DDP says where it is.

``torch.nn.parallel.DistributedDataParallel`` runs its collectives in C++ (the reducer's gradient all_reduce in
backward, the buffer broadcast in forward), out of sight of the Python-level hooks of ``ops.connect``. In a
launched worker, ``connect(progress)`` makes every DDP model made afterwards report them, without changing what
DDP computes or how:

- **Gradients**: after a forward that will synchronize gradients, a hook on the output's gradient marks the
  start of that backward: the record says ``"DDP gradient all_reduce"``, the model's step and the user's line
  (the first frame outside torch and this package: their ``loss.backward()``; where backward runs on another
  thread, as on CUDA, the line of the model's forward). Two callbacks queued on the autograd engine mark the
  end: the second runs after DDP's own ``finalize_backward``, which waits for every bucket's all_reduce, and
  records the leave and ``progressed_at``. The time between the two is what the rank waited for the others
  (``ProgressRecord.waited``, for the run's balance; on CUDA, where DDP's wait only queues the all_reduce, the
  time between two CUDA events recorded there, read once the GPU has passed them), and the second ends the
  rank's step for ``balance_meter`` (the first DDP model's, when a rank trains several). So a rank is "inside"
  from the start of its backward through the model until DDP has all the averaged gradients; blocked there, the record says so. ``step`` counts the
  model's synchronized backward passes (1 for the first; ``no_sync()`` passes do not count).
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

Limits: the backward is seen when the loss depends on a tensor the model returns directly or in a tuple, list
or dict (``ModelOutput`` included), one level deep; "inside" covers the backward's own computation through the
model too (the record cannot tell it from the wait); a backward that raised is closed at the model's next
forward. The raw torch.distributed collectives DDP runs from Python inside these are not recorded or checked
again by ``ops``. ``NOTEBOOK_LAUNCHER_DDP_WATCH=0`` (or false/no/off) in the environment before the launch leaves DDP
untouched.
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

from . import balance_meter
from .ops import call_site, set_inside

ENV_VAR = "NOTEBOOK_LAUNCHER_DDP_WATCH"
GRADIENTS = "DDP gradient all_reduce"
BUFFERS = "DDP buffer broadcast"
PARAMETERS = "DDP parameter broadcast"
JOIN = "DDP join"
_ATTRIBUTE = "_notebook_launcher_watch"
_OFF_VALUES = ("0", "false", "no", "off", "n", "f")
_engine = torch.autograd.Variable._execution_engine
_originals: dict = {}
_progress = None  # the rank's ProgressRecord, set by connect()


def enabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in _OFF_VALUES


def connect(progress) -> bool:
    """Every DDP model made from now on in this process reports its collectives to ``progress``; False (and
    nothing changed) when ``NOTEBOOK_LAUNCHER_DDP_WATCH`` turns it off."""
    global _progress
    if not enabled() or progress is None:
        return False
    _progress = progress
    if not _originals:
        for owner, name, replacement in _PATCHES:
            _originals[name] = owner.__dict__[name]
            setattr(owner, name, replacement)
    return True


def disconnect() -> None:
    """DDP as torch has it; models made while connected record nothing more."""
    global _progress
    for owner, name, _ in _PATCHES:
        if name in _originals:
            setattr(owner, name, _originals.pop(name))
    _progress = None


class _Watch:
    """One DDP model's side of the record: its step, and whether a synchronized backward is to come."""

    __slots__ = ("step", "armed", "open", "forward_site", "reducing_since", "on_cuda", "gpu_waits")

    def __init__(self, model):
        self.step = 0
        self.armed = False  # a forward that will synchronize gradients ran; its backward has not started
        self.open = False  # its backward started and has not ended (a backward that raised never ends)
        self.reducing_since = 0.0  # when the backward's own computation ended and DDP's wait began
        self.on_cuda = any(p.device.type == "cuda" for p in model.parameters())
        # on CUDA, DDP's wait returns once the all_reduce is queued: the GPU's own clock times the wait, between
        # two events on the stream that waits for it (pairs not yet completed, oldest first)
        self.gpu_waits: list = []
        # backward runs on the calling thread for CPU models, where its frames name the user's line
        self.forward_site = "?" if any(p.device.type != "cpu" for p in model.parameters()) else ""

    def after_forward(self, model, output) -> None:
        if self.open:  # the last backward raised (its callbacks never ran): it is over all the same
            self.finish()
        if not (model.require_backward_grad_sync and torch.is_grad_enabled()):
            return  # no_sync(), eval: no collective in backward
        tensors = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) \
            else (output,)
        hooked = False
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                tensor.register_hook(self.backward_starts)
                hooked = True
        self.armed = hooked
        if hooked and self.forward_site:
            self.forward_site = call_site()

    def backward_starts(self, grad) -> None:
        if not self.armed:
            return  # another output of the same forward
        self.armed = False
        self.step += 1
        site = call_site()
        _progress.enter(GRADIENTS, self.forward_site if site == "?" and self.forward_site else site, self.step)
        self.open = True
        _engine.queue_callback(self.after_ddp_queued)  # runs before DDP's finalize_backward, queued later...

    def after_ddp_queued(self) -> None:
        self.reducing_since = time.monotonic()
        if self.on_cuda:
            self.gpu_waits.append([_cuda_event(), None])
        _engine.queue_callback(self.finish)  # ...so this one runs after it: every bucket is reduced then

    def finish(self) -> None:
        self.open = False
        since, self.reducing_since = self.reducing_since, 0.0
        if self.on_cuda:
            if self.gpu_waits and self.gpu_waits[-1][1] is None:
                self.gpu_waits[-1][1] = _cuda_event()
            _progress.leave(self.gpu_seconds_waited())
        else:
            _progress.leave(time.monotonic() - since if since else 0.0)
        balance_meter.step_done(balance_meter.DDP_STEPS, self.step, owner=self)

    def gpu_seconds_waited(self) -> float:
        """The GPU waits that have completed since the last call (the newest may complete a step later)."""
        waited = 0.0
        while self.gpu_waits and self.gpu_waits[0][1] is not None and self.gpu_waits[0][1].query():
            start, end = self.gpu_waits.pop(0)
            waited += start.elapsed_time(end) / 1000.0
        del self.gpu_waits[:-64]  # never completed (a device error): not kept forever
        return waited


def _cuda_event():
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _init(self, *args, **kwargs):
    _originals["__init__"](self, *args, **kwargs)
    if _progress is not None and dist.is_initialized():
        self.__dict__[_ATTRIBUTE] = _Watch(self)


def _construction_collective(name: str):
    """DDP's construction calls these two collectives (``torch.distributed.utils``) by their names in its module:
    each is recorded as the parameter broadcast, the rest of the construction as the rank's own work."""

    def collective(*args, **kwargs):
        if _progress is None:
            return _originals[name](*args, **kwargs)
        with _Inside(PARAMETERS, 0):
            return _originals[name](*args, **kwargs)

    return collective


def _register_comm_hook(self, state: object, hook) -> None:
    if _progress is None or not callable(hook):
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
    if watch is not None and _progress is not None:
        watch.after_forward(self, output)
    return output


def _sync_buffers(self):
    watch = self.__dict__.get(_ATTRIBUTE)
    if watch is None or _progress is None:
        return _originals["_sync_buffers"](self)
    with _Inside(BUFFERS, watch.step + 1):  # before the backward of the coming step
        return _originals["_sync_buffers"](self)


def _join_main_hook(self):
    watch = self.ddp.__dict__.get(_ATTRIBUTE)
    if watch is None or _progress is None:
        return _originals["main_hook"](self)
    with _Inside(JOIN, watch.step):
        return _originals["main_hook"](self)


class _Inside:
    """In one of DDP's collectives (run from Python): recorded at the user's line; the raw collectives it
    calls are not recorded again."""

    def __init__(self, operation: str, step: int):
        self.operation, self.step = operation, step

    def __enter__(self):
        _progress.enter(self.operation, call_site(), self.step)
        self.outer = set_inside(True)

    def __exit__(self, *exc_info):
        set_inside(self.outer)
        _progress.leave()
        return False


_PATCHES = ((DistributedDataParallel, "__init__", _init), (DistributedDataParallel, "_post_forward", _post_forward),
            (DistributedDataParallel, "register_comm_hook", _register_comm_hook),
            (DistributedDataParallel, "_sync_buffers", _sync_buffers), (_DDPJoinHook, "main_hook", _join_main_hook),
            *((_ddp_module, name, _construction_collective(name))
              for name in ("_verify_param_shape_across_processes", "_sync_module_states")))
