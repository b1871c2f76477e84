"""What travels to a worker that does not inherit the kernel's memory (spawn, another host): the function and
its arguments, pickled in the kernel so that what cannot be pickled is named before any process starts."""

from __future__ import annotations

import sys


def spawn_payload(function, args) -> bytes:
    """What a spawned worker loads: the kernel's sys.path, then (function, args) by cloudpickle.

    Pickled here, in the kernel, so an unpicklable function or argument is named before any process starts.
    """
    import pickle

    import cloudpickle

    try:
        return pickle.dumps(list(sys.path)) + cloudpickle.dumps((function, tuple(args)))
    except Exception:  # noqa: BLE001 - find which object it was, for the message
        pass
    name = getattr(function, "__qualname__", repr(function))
    try:
        cloudpickle.dumps(function)
    except Exception as exc:  # noqa: BLE001 - any pickling error is reported the same way
        culprit = _unpicklable_reference(function)
        what = f"it refers to {culprit}" if culprit else f"{type(exc).__name__}: {exc}"
        raise TypeError(
            f"function {name} cannot be pickled for start_method='spawn': {what}. Create that object inside the "
            f"function, or use start_method='fork'.") from exc
    culprit = first_unpicklable((f"args[{index}]", value) for index, value in enumerate(args))
    if culprit:
        label, value, exc = culprit
        raise TypeError(
            f"{label} (a {type(value).__name__}) cannot be pickled for start_method='spawn': "
            f"{type(exc).__name__}: {exc}. Create it inside the function, or use start_method='fork'.") from exc
    return pickle.dumps(list(sys.path)) + cloudpickle.dumps((function, tuple(args)))  # raises what it raises


def first_unpicklable(named_values):
    """The first (name, value, error) that cloudpickle cannot pickle, modules skipped (they go by name)."""
    import cloudpickle

    for name, value in named_values:
        if isinstance(value, type(sys)):
            continue
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - any pickling error is reported the same way
            return name, value, exc
    return None


def _unpicklable_reference(function) -> str:
    """The first global or closure variable of ``function`` that cloudpickle cannot pickle, described."""
    code = getattr(function, "__code__", None)
    if code is None:
        return ""
    candidates = []
    for var, cell in zip(code.co_freevars, getattr(function, "__closure__", None) or ()):
        try:
            candidates.append((var, cell.cell_contents))
        except ValueError:
            continue
    function_globals = getattr(function, "__globals__", {})
    candidates += [(var, function_globals[var]) for var in code.co_names if var in function_globals]
    culprit = first_unpicklable(candidates)
    return f"`{culprit[0]}` (a {type(culprit[1]).__name__})" if culprit else ""
