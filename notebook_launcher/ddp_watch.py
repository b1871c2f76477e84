"""DDP's own collectives in the rank's progress record, so a hang inside DDP says where it is.

``torch.nn.parallel.DistributedDataParallel`` runs its collectives in C++ (the reducer's gradient all_reduce in
backward, the buffer broadcast in forward), out of sight of the Python-level hooks of ``ops.connect``. In a
launched worker, ``connect(progress)`` makes every DDP model report them:

- **Gradients**: each model gets a communication hook (registered at its first forward, unless one was
  registered before). The hook does exactly what DDP does without one: torch's own
  ``default_hooks.allreduce_hook`` (divide by the world size, then all_reduce; the same numbers as DDP's
  built-in path). At the first bucket of a backward it records ``"DDP gradient all_reduce"``, the model's
  step and the user's line (the first frame outside torch and this package: their ``loss.backward()``; where
  backward runs on another thread, as on CUDA, the line of the last ``model(x)``); when every bucket's
  future has completed it records the leave and ``progressed_at``. ``step`` counts the model's synchronized
  backward passes (1 for the first; ``no_sync()`` passes do not count).
- **A user's own hook** (``model.register_comm_hook(state, hook)``, before or after the first forward) keeps
  working: it replaces torch's allreduce inside ours, so their hook computes the result DDP uses and the
  record still shows the collective. Registering twice fails as in torch. A built-in C++ hook
  (``_register_builtin_comm_hook``, registered before the first forward) and DDP's ``mixed_precision`` keep
  their own hook: that model's gradients are then not recorded. So is a model under ``join()`` that divides
  by the number of ranks still active (``divide_by_initial_world_size=False``), which only DDP's built-in
  path knows.
- **Buffers**: DDP's buffer broadcast (models with buffers, e.g. BatchNorm) is recorded as
  ``"DDP buffer broadcast"`` around ``_sync_buffers``, at the user's ``model(x)`` line, with the step of the
  backward to come.
- **Construction**: ``DistributedDataParallel(model)`` checks the parameters' shapes across ranks and
  broadcasts rank 0's parameters and buffers: recorded as ``"DDP parameter broadcast"`` (step 0) at the
  user's line.

Collectives torch.distributed runs from Python inside these (e.g. the all_reduce in ``allreduce_hook``) are
not recorded or checked again by ``ops``. ``NOTEBOOK_LAUNCHER_DDP_WATCH=0`` (or false/no/off) in the worker's
environment (set it before the launch) leaves DDP untouched.
"""

from __future__ import annotations

import os
import threading

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from .ops import call_site, set_inside

ENV_VAR = "NOTEBOOK_LAUNCHER_DDP_WATCH"
GRADIENTS = "DDP gradient all_reduce"
BUFFERS = "DDP buffer broadcast"
PARAMETERS = "DDP parameter broadcast"
_ATTRIBUTE = "_notebook_launcher_watch"
_OFF_VALUES = ("0", "false", "no", "off", "n", "f")
_PATCHED = ("__init__", "register_comm_hook", "_register_builtin_comm_hook", "_sync_buffers")
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
        _originals.update({name: DistributedDataParallel.__dict__[name] for name in _PATCHED})
        for name, replacement in zip(_PATCHED, (_init, _register_comm_hook, _register_builtin, _sync_buffers)):
            setattr(DistributedDataParallel, name, replacement)
    return True


def disconnect() -> None:
    """DDP as torch has it (models already made keep their hook)."""
    global _progress
    for name, original in _originals.items():
        setattr(DistributedDataParallel, name, original)
    _originals.clear()
    _progress = None


class _Watch:
    """One DDP model's side of the record: its step, the buckets in flight, the hook inside ours (if any)."""

    __slots__ = ("process_group", "inner", "state", "registered", "off", "step", "in_step", "pending",
                 "lock", "forward_site", "first_forward")

    def __init__(self, model):
        self.process_group = model.process_group
        self.inner = self.state = None  # a user's hook and its state, run instead of allreduce_hook
        self.registered = False  # ours is the reducer's comm hook
        self.off = bool(model._comm_hooks)  # a hook (mixed_precision's) was registered in __init__
        self.step = self.pending = 0
        self.in_step = False  # between a backward's first bucket and its last
        self.lock = threading.Lock()  # the buckets' futures complete on the backend's threads
        # backward runs on the calling thread for CPU models: its frames name the user's line; else the forward's
        self.forward_site = "?" if any(p.device.type != "cpu" for p in model.parameters()) else ""
        self.first_forward = model.register_forward_pre_hook(self.before_forward, prepend=True)

    def before_forward(self, model, inputs):
        if self.first_forward is not None:
            self.first_forward.remove()
            self.first_forward = None
            config = model._join_config
            if config.enable and not config.divide_by_initial_world_size:
                self.off = True  # DDP's divisor is then the number of ranks still active: only C++ knows it
            if not self.off and not self.registered:
                self.register(model)
            if self.forward_site:  # not a CPU model: keep the forward's line for the backward
                model.register_forward_pre_hook(self.remember_site, prepend=True)
                self.remember_site(model, inputs)

    def remember_site(self, model, inputs):
        self.forward_site = call_site()

    def register(self, model) -> None:
        dist._register_comm_hook(model.reducer, self, _watched_hook)
        self.registered = True

    def completed(self, future) -> None:
        with self.lock:
            self.pending -= 1
            done = self.pending == 0 and not self.in_step
        if done:
            _progress.leave()

    def abandon(self) -> None:
        """A hook raised: the backward is over, whatever DDP does next."""
        with self.lock:
            self.pending, self.in_step = 0, False
        _progress.leave()


def _watched_hook(watch: _Watch, bucket):
    """The comm hook of a watched model: records the collective, then torch's allreduce_hook or the user's."""
    if not watch.in_step:
        watch.step += 1
        site = call_site()
        _progress.enter(GRADIENTS, site if site != "?" or not watch.forward_site else watch.forward_site,
                        watch.step)
    with watch.lock:
        watch.pending += 1
        watch.in_step = not bucket.is_last()
    outer = set_inside(True)
    try:
        if watch.inner is None:
            future = allreduce_hook(watch.process_group, bucket)
        else:
            future = watch.inner(watch.state, bucket)
    except BaseException:
        watch.abandon()
        raise
    finally:
        set_inside(outer)
    future.add_done_callback(watch.completed)
    return future


def _init(self, *args, **kwargs):
    if _progress is None or not dist.is_initialized():
        return _originals["__init__"](self, *args, **kwargs)
    _progress.enter(PARAMETERS, call_site())
    outer = set_inside(True)
    try:
        _originals["__init__"](self, *args, **kwargs)
    finally:
        set_inside(outer)
        _progress.leave()
    self.__dict__[_ATTRIBUTE] = _Watch(self)


def _register_comm_hook(self, state: object, hook) -> None:
    watch = self.__dict__.get(_ATTRIBUTE)
    if watch is None or watch.off:
        return _originals["register_comm_hook"](self, state, hook)
    if watch.inner is not None:
        raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
    # what DDP's own register_comm_hook does, but the reducer's hook stays ours, with the user's inside
    self._check_comm_hook(hook)
    self.logger._set_comm_hook_name(hook.__qualname__)
    self._comm_hooks.append((hook, state))
    watch.inner, watch.state = hook, state
    if not watch.registered:
        watch.register(self)


def _register_builtin(self, comm_hook_type):
    watch = self.__dict__.get(_ATTRIBUTE)
    if watch is not None and not watch.registered:
        watch.off = True  # C++'s own hook: nothing of ours can run inside it
    return _originals["_register_builtin_comm_hook"](self, comm_hook_type)


def _sync_buffers(self):
    if _progress is None or self.__dict__.get(_ATTRIBUTE) is None:
        return _originals["_sync_buffers"](self)
    watch = self.__dict__[_ATTRIBUTE]
    _progress.enter(BUFFERS, call_site(), watch.step + 1)  # before the backward of the coming step
    outer = set_inside(True)
    try:
        return _originals["_sync_buffers"](self)
    finally:
        set_inside(outer)
        _progress.leave()

