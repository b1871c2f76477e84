"""The notebook's own models and tensors after a launch: each rank trained a copy, the notebook's is unchanged.

A forked rank inherits the notebook's objects as copies of the kernel's memory; a spawned one unpickles
them. Either way, what the function does to ``model`` changes the ranks' copies, never the notebook's, and a
user who trains a model defined in a cell and returns nothing finds it untrained afterwards, without a word.
``unchanged_note`` says so in one line, with the way to bring the weights back, when the function uses a
trainable module or tensor of the notebook (a global of the function or of the cell, or one of its ``args``)
and returns no module or tensor. Only objects that can be trained count (a module with a parameter that
requires grad, a tensor that requires grad), so a function that uses data tensors or returns its weights
hears nothing. Kernel side; it looks at the function and its result, never at a rank.
"""

from __future__ import annotations

import functools
import sys
import types

_MAX_DEPTH = 4  # how deep a result is looked into for a module or a tensor (a dict of state dicts is 2)
_MAX_LOOKS = 10_000  # how many of its values at most


def is_cell_program(function) -> bool:
    """A cell run by ``%%accelerate`` (``magic.CellProgram``): the notebook names it uses are its namespace, and
    the magic says this itself, once the names the cell assigned are back."""
    return isinstance(getattr(function, "namespace", None), dict)


def unchanged_note(function, args: tuple, result) -> str | None:
    """One line naming the notebook's objects the function trained copies of, or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    names = [name for name, value in _used_objects(function, args) if _trainable(value, torch)]
    if not names or _holds_weights(result, torch, _MAX_DEPTH, [_MAX_LOOKS]):
        return None
    shown = ", ".join(f"`{name}`" for name in names)
    first = names[0] if names[0].isidentifier() else "model"
    if is_cell_program(function):  # what the cell assigns comes back
        how = (f"assign them in the cell (`weights = {first}.state_dict()`: rank 0's comes back) and load them in "
               f"the next one: `{first}.load_state_dict(weights)`")
    else:
        how = (f"return them from the function (`return {first}.state_dict()`: rank 0's comes back) and load "
               f"them here: `{first}.load_state_dict(notebook_launcher(...))`")
    return (f"notebook_launcher: the ranks trained copies of the notebook's {shown}; the notebook's {shown} "
            f"{'is' if len(names) == 1 else 'are'} unchanged. To bring the trained weights back, {how}.")


def _used_objects(function, args: tuple) -> list[tuple[str, object]]:
    """(name, value) of what the function reaches of the notebook: the globals its code names and the
    variables it closes over, when it was defined in the notebook (``__main__``), a cell's names under
    ``%%accelerate``, and the arguments passed to it."""
    main = getattr(sys.modules.get("__main__"), "__dict__", None)
    found: dict[int, tuple[str, object]] = {}
    while isinstance(function, functools.partial):
        args = tuple(function.args) + tuple(args)
        function = function.func
    if is_cell_program(function):  # the notebook names the cell uses
        returned = set(getattr(function, "return_names", ()))
        for name, value in function.namespace.items():
            if name not in returned:
                found.setdefault(id(value), (name, value))
    if isinstance(function, types.FunctionType) and function.__globals__ is main:
        for name in _names(function.__code__):
            if name in main:
                found.setdefault(id(main[name]), (name, main[name]))
        for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
            try:
                found.setdefault(id(cell.cell_contents), (name, cell.cell_contents))
            except ValueError:  # an empty cell
                continue
    for index, value in enumerate(args):
        notebook_name = next((name for name, known in (main or {}).items()
                              if known is value and not name.startswith("_")), None)
        found.setdefault(id(value), (notebook_name or f"args[{index}]", value))
    return list(found.values())


def _names(code: types.CodeType) -> set[str]:
    """Every global name ``code`` and the functions and classes defined in it load."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


def _trainable(value, torch) -> bool:
    if isinstance(value, torch.nn.Module):
        return any(parameter.requires_grad for parameter in value.parameters())
    return isinstance(value, torch.Tensor) and value.requires_grad


def _holds_weights(value, torch, depth: int, looks: list[int]) -> bool:
    """Whether a result carries a module or a tensor (a state dict, the model itself), looked ``depth`` deep and
    at ``looks[0]`` values at most (a result of a million numbers is not walked)."""
    looks[0] -= 1
    if isinstance(value, (torch.nn.Module, torch.Tensor)):
        return True
    if depth == 0 or looks[0] <= 0:
        return False
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        if looks[0] <= 0:
            return False
        if _holds_weights(item, torch, depth - 1, looks):
            return True
    return False
