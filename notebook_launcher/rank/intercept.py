"""Catch a function at its object, not at the attribute that names it: every reference sees the hook.

``from torch.distributed import all_reduce`` in a notebook cell, a ``functools.partial(dist.barrier)`` made before
the launch, ``distributed_c10d.all_gather`` called directly, torch's own object collectives calling
``all_gather`` by its module global: all of these hold the *function object*, so rebinding
``torch.distributed.all_reduce`` (what the hooks did before) misses them. Here the function object itself is
changed, in the rank's process only: its code becomes a trampoline that calls a hook (kept in the function's
``__kwdefaults__``, under a keyword no caller passes), and an untouched copy of the function is what the hook
calls. Name, ``__wrapped__``, ``inspect.signature``, module and identity stay as they were, so pickling and
``is`` comparisons see nothing new.

One extra Python call per collective (the trampoline): about 0.1 µs, beside a collective's hundreds of µs on
gloo (``benchmarks/collective_hooks.py`` compares it with the attribute hooks and with no hook).
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from collections.abc import Callable

_THIS_FILE = os.path.abspath(__file__)
HOOK_KEYWORD = "_notebook_launcher_hook_"  # where the trampoline finds its hook: a keyword nobody passes
_TRAMPOLINES: dict[int, types.CodeType] = {}  # number of free variables -> the trampoline's code


def _shown_in_tracebacks():
    """What a traceback shows of a trampoline's frame: its code is made (below) so that its call of the hook is
    this function's line, and reads as what it is."""
    def collective(*args, _notebook_launcher_hook_=None, **kwargs):
        return _notebook_launcher_hook_(*args, **kwargs)  # notebook_launcher: this collective, watched
    return collective


_SHOWN_CODE = _shown_in_tracebacks().__code__
_SHOWN_LINE = max(line for _, _, line in _SHOWN_CODE.co_lines() if line is not None)  # the hook's call


def _trampoline(free_variables: int) -> types.CodeType:
    """Code that calls ``HOOK_KEYWORD``'s default with the call's arguments; it has as many free variables as
    the function it replaces (CPython checks that the closure still fits the code), and never reads them. Its
    line numbers put the hook's call on ``_shown_in_tracebacks``'s line, which has the same text and columns."""
    if free_variables not in _TRAMPOLINES:
        names = [f"_free_{index}" for index in range(free_variables)]
        source = ["def _outer():"] + [f"    {name} = None" for name in names] + [
            f"    def collective(*args, {HOOK_KEYWORD}=None, **kwargs):",
            f"        return {HOOK_KEYWORD}(*args, **kwargs)",
        ]
        if names:  # a reference in the body makes them free variables of `collective` (never evaluated)
            source.insert(-1, f"        if {HOOK_KEYWORD} is None: ({', '.join(names)},)")
        source.append("    return collective")
        namespace: dict = {}
        exec(compile("\n".join(source), "<notebook_launcher trampoline>", "exec"), namespace)  # noqa: S102
        code = namespace["_outer"]().__code__
        call_line = max(line for _, _, line in code.co_lines() if line is not None)
        _TRAMPOLINES[free_variables] = code.replace(co_firstlineno=code.co_firstlineno + _SHOWN_LINE - call_line)
    return _TRAMPOLINES[free_variables]


def own_function(name: str, candidates, home: str) -> types.FunctionType | None:
    """The function named ``name`` whose code lives under folder ``home`` (torch's own), among ``candidates``
    and what they wrap (``__wrapped__``, a partial's ``func``): a user's wrapper put in its place is left alone,
    the function it calls is the one to intercept. None if none of them leads to it."""
    seen = set()
    pending = [candidate for candidate in candidates if candidate is not None]
    while pending:
        candidate = pending.pop(0)
        if id(candidate) in seen or len(seen) > 32:
            continue
        seen.add(id(candidate))
        code = getattr(candidate, "__code__", None) if isinstance(candidate, types.FunctionType) else None
        if code is not None and getattr(candidate, "__name__", None) == name and \
                os.path.abspath(code.co_filename).startswith(home):
            return candidate
        for attribute in ("__wrapped__", "func"):
            inner = getattr(candidate, attribute, None)
            if inner is not None:
                pending.append(inner)
    return None


def own_functions(names, namespaces, home: str) -> tuple[dict, dict]:
    """For each of ``names``: the function ``own_function`` finds behind the namespaces' attributes of that
    name; where none leads to it, the first namespace's callable, in both dicts returned (the second: those
    whose own function is hidden, so they cannot be intercepted)."""
    found, hidden = {}, {}
    for name in names:
        present = [getattr(namespace, name, None) for namespace in namespaces]
        function = own_function(name, present, home)
        if function is not None:
            found[name] = function
        elif callable(present[0]):
            found[name] = hidden[name] = present[0]
    return found, hidden


def is_intercepted(function) -> bool:
    return isinstance(function, types.FunctionType) and HOOK_KEYWORD in (function.__kwdefaults__ or {})


def copy_of(function: types.FunctionType) -> types.FunctionType:
    """A new function object with ``function``'s code, globals, defaults, closure and attributes."""
    copy = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = dict(function.__kwdefaults__) if function.__kwdefaults__ else None
    copy.__dict__.update(function.__dict__)
    copy.__annotations__ = dict(function.__annotations__)
    copy.__qualname__, copy.__module__, copy.__doc__ = function.__qualname__, function.__module__, function.__doc__
    return copy


def intercept(function: types.FunctionType, make_hook: Callable[[Callable], Callable]) -> types.FunctionType:
    """Make every call of ``function`` (by any reference) a call of ``make_hook(original)``, where ``original``
    is a copy of ``function`` as it was; returns that original. Calling it twice on one function is refused."""
    if not isinstance(function, types.FunctionType):
        raise TypeError(f"only Python functions can be intercepted, not {function!r}")
    if is_intercepted(function):
        raise RuntimeError(f"{function.__qualname__} is intercepted already")
    original = copy_of(function)
    had_signature = "__signature__" in function.__dict__
    function.__signature__ = inspect.signature(original)
    hook = make_hook(original)
    # named as the function, in this file: a stack shows `all_reduce`, counts it as ours, and shows the line
    # of _shown_in_tracebacks that calls the hook
    names = {"co_name": function.__name__, "co_filename": _THIS_FILE}
    if sys.version_info >= (3, 11):
        names["co_qualname"] = function.__qualname__
    function.__code__ = _trampoline(len(function.__code__.co_freevars)).replace(**names)
    function.__kwdefaults__ = {HOOK_KEYWORD: hook}
    function.__dict__["_notebook_launcher_original_"] = original
    function.__dict__["_notebook_launcher_had_signature_"] = had_signature
    return original


def restore(function: types.FunctionType) -> None:
    """``function`` as it was before ``intercept`` (nothing if it was not intercepted)."""
    original = function.__dict__.pop("_notebook_launcher_original_", None)
    if original is None:
        return
    function.__code__ = original.__code__
    function.__kwdefaults__ = original.__kwdefaults__
    if not function.__dict__.pop("_notebook_launcher_had_signature_", False):
        function.__dict__.pop("__signature__", None)
