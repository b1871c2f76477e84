"""Worker side: Accelerate's state objects see the launch as they would under ``accelerate launch``, on CPU too.

Two things differ from a process Accelerate started itself:

- an ``Accelerator`` made in the notebook before the launch is inherited through fork, and Accelerate would then
  refuse to set up the distributed state in the worker: each worker forgets it;
- ``PartialState()`` (and ``AcceleratorState()``) with no arguments decides "multi-CPU" only when ``cpu=True`` is
  passed (``Accelerator()`` passes it when ``ACCELERATE_USE_CPU`` is set; a bare ``PartialState()`` does not, and
  then reports one process on every rank). In a CPU launch, ``cpu`` defaults to True here, as the environment
  says. Accelerate is not imported for this: the change is made when (and if) the user's code imports it.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

from ..schema.events import TRUE_VALUES

_MODULE = "accelerate.state"


def prepare_accelerate(cpu_launch: bool) -> None:
    """Called in each worker before the user's function runs."""
    state = sys.modules.get(_MODULE)
    if state is not None:
        _forget_inherited_state(state)
        if cpu_launch:
            _default_to_cpu(state)
    elif cpu_launch:
        sys.meta_path.insert(0, _PatchOnImport())


def _forget_inherited_state(state) -> None:
    for holder in ("AcceleratorState", "PartialState", "GradientState"):
        shared = getattr(getattr(state, holder, None), "_shared_state", None)
        if shared is not None:
            shared.clear()


def _default_to_cpu(state) -> None:
    """``PartialState(cpu=False)`` reads ``ACCELERATE_USE_CPU`` (our CPU launches set it), as ``Accelerator`` does."""
    partial = getattr(state, "PartialState", None)
    original = getattr(partial, "__init__", None)
    if original is None or getattr(original, "_reads_use_cpu", False):
        return

    def __init__(self, cpu: bool = False, **kwargs):
        if not cpu and os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in TRUE_VALUES:
            cpu = True
        original(self, cpu, **kwargs)

    __init__._reads_use_cpu = True
    __init__.__doc__ = original.__doc__
    partial.__init__ = __init__


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Waits for ``accelerate.state`` to be imported, then applies ``_default_to_cpu`` to it (once)."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        original_exec = spec.loader.exec_module

        def exec_module(module):
            original_exec(module)
            _default_to_cpu(module)

        spec.loader.exec_module = exec_module
        return spec
