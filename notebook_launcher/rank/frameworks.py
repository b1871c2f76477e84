"""What frameworks see of a rank: a worker of a launch already made, not an interactive session to launch from.

A forked rank is a copy of the kernel, so everything a framework reads to tell a notebook from a script says
"interactive" there: ``sys.ps1`` (set by IPython), and Lightning's ``_IS_INTERACTIVE``, computed from it when
Lightning was imported in the kernel and copied by name into each module that imports it. Lightning then
refuses ``strategy="ddp"`` on the very processes it should use. ``not_interactive()`` makes each of them read
as a worker's, in the rank only (the kernel is untouched). IPython's shell is kept: ``display()`` in a rank
goes through it (``rich_output``).

A launcher inside a launch (Lightning's ``ddp_notebook``/``ddp_spawn``, ``torch.multiprocessing.spawn``,
Accelerate's ``notebook_launcher`` called in the function) would start a second set of ranks below each of
ours, whose process groups cannot meet: ``refuse_nested_launchers()`` makes torch's ways to start them,
``torch.multiprocessing.start_processes`` and torch elastic's ``launch_agent``, raise at once with the fix.

What a rank forks (a DataLoader worker, a ``multiprocessing`` child) is not the rank: ``at_fork()`` leaves it the
rank's output but not its story (no progress record, no debug check, no balance figures), and makes it die with
the process that forked it. The rank itself dies by SIGKILL when the kernel dies (``die_with_parent``), so
nothing in the rank can end its children then; a parent-death signal set in each child at the fork is what
still acts (a subreaper cannot: the rank is the subreaper, and it is dead). It covers every process started by
``os.fork`` (``multiprocessing``'s fork context, DataLoader workers) and what those fork in turn; a program a
rank starts by ``subprocess`` or spawn is ended by the rank when it returns or by the kernel when the rank dies
(``proctree``, ``supervision/orphans``), not when the kernel is killed. Linux sends the signal when the *thread*
that forked ends: a child forked by a short-lived thread of the rank ends with that thread.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from dataclasses import replace

from ..schema.error_base import NotebookLauncherError
from ..schema.proctree import die_with_parent
from . import balance_meter, context
from .intercept import intercept, is_intercepted

LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")  # where the flag is copied
INTERACTIVE_FLAG = "_IS_INTERACTIVE"  # Lightning's (lightning.fabric.utilities.imports, and its importers)
ELASTIC_LAUNCHER = "torch.distributed.launcher.api"  # torch elastic's launch_agent: Accelerate's, torchrun's


class LauncherInLaunchError(NotebookLauncherError, RuntimeError):
    """A launcher was called inside a launched rank (every rank calls it: each raises this)."""

    raised_on_every_rank = True


def not_interactive() -> None:
    """This process reads as a script's worker: no ``sys.ps1``/``sys.ps2``, and every module's copy of
    Lightning's ``_IS_INTERACTIVE`` False (a Lightning imported later computes False by itself)."""
    for name in ("ps1", "ps2"):
        if hasattr(sys, name):
            delattr(sys, name)
    if not any(package in sys.modules for package in LIGHTNING_PACKAGES):
        return  # (no scan: a forked rank pays for every module it touches, 6 ms for all of them)
    for name, module in list(sys.modules.items()):
        if not name.startswith(LIGHTNING_PACKAGES):
            continue
        namespace = getattr(module, "__dict__", None)  # never getattr on the module: a lazy one would import
        if isinstance(namespace, dict) and namespace.get(INTERACTIVE_FLAG) is True:
            namespace[INTERACTIVE_FLAG] = False


def refuse_nested_launchers() -> None:
    """Launchers called in this rank raise ``LauncherInLaunchError``, by any reference: torch's
    ``multiprocessing.start_processes`` (behind ``spawn``, Lightning's ``ddp_notebook``/``ddp_spawn``) and torch
    elastic's ``launch_agent`` (behind Accelerate's ``notebook_launcher``, ``torch.distributed.run``), which
    would otherwise first wait in a rendezvous of its own. The latter is caught when its module is imported:
    importing it here would cost every rank a third of a second."""
    refuse_in(importlib.import_module("torch.multiprocessing.spawn"), "start_processes")
    when_imported(ELASTIC_LAUNCHER, lambda module: refuse_in(module, "launch_agent"))


def when_imported(name: str, then) -> None:
    """``then(module)`` at once where the module ``name`` is imported already, else once it is: what a rank
    patches only when it is used costs nothing to every other rank."""
    if name in sys.modules:
        then(sys.modules[name])
    elif not any(isinstance(finder, _WhenImported) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenImported(name, then))


def refuse_in(module, name: str) -> None:
    function = getattr(module, name, None)
    if isinstance(function, types.FunctionType) and not is_intercepted(function):
        intercept(function, lambda original: _refuse)


class _WhenImported:
    """A finder that calls ``then(module)`` once the module ``name`` has been imported (then leaves)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            exec_module = spec.loader.exec_module

            def exec_then(module):
                exec_module(module)
                self.then(module)

            spec.loader.exec_module = exec_then
        return spec


def _refuse(*args, **kwargs):
    raise LauncherInLaunchError(
        "a launcher was called inside a launched rank (Lightning's strategy='ddp_notebook'/'ddp_spawn', "
        "torch.multiprocessing.spawn, accelerate.notebook_launcher, torch elastic's launch_agent): "
        "notebook_launcher has started the processes already. Use them as a script's ranks: "
        "Trainer(strategy='ddp') or Fabric(strategy='ddp') in Lightning, Accelerator() directly in Accelerate, "
        "and call the training code itself instead of spawning it.")


def at_fork() -> None:
    """Every process forked from here on (and from those) dies with its parent and tells nothing as the rank."""
    parent = [os.getpid()]

    def before() -> None:
        parent[0] = os.getpid()

    def in_child() -> None:
        die_with_parent(parent[0])
        context.enter(replace(context.current, progress=None, debug=False, distributed=False))
        balance_meter.forget()

    os.register_at_fork(before=before, after_in_child=in_child)
