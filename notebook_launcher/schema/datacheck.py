"""An event's data checked against its kind's table (``kinds.DATA_SCHEMA``), where the kernel reads it.

Everything a rank writes is untrusted: the kernel's readers (the attempts, the failure tracker, the panel, the run
log) take each field as its table says, so a field of another type, a required one missing, NaN or an infinity
for a number, a list or dict beyond its bound, or a key that is not a str, is found here, once, as the frame is
read, and named (kind and field) in the rank's ``CorruptEventStream`` failure.
"""

from __future__ import annotations

from .kinds import DATA_SCHEMA, NUMBER, Fields, ListOf, MapOf, OneOf


def data_problem(kind: str, data: dict) -> str:
    """What is wrong with an event's data by its kind's table (``kinds.DATA_SCHEMA``), naming the kind and the
    field; "" when nothing is. The decoder asks it of every dict frame a rank sends (a text or record frame, the
    usual line, is checked by its own tuple's types and never comes here)."""
    table = DATA_SCHEMA.get(kind)
    if table is None:
        return f"a {_cut(kind)!r} event: no event has that kind"
    problem = _fields_problem(table, data, "")
    return f"a {kind!r} event {problem}" if problem else ""


def bounds_problem(kind: str, data: dict, most_deep: int, int_bound: int) -> str:
    """Where in an event's data an int goes beyond 64 bits or lists and dicts nest deeper than ``most_deep`` (the
    decoder found one of them; this finds where, to name it)."""
    def walk(value, path: str, depth: int) -> str:
        if type(value) is int and not -int_bound <= value < int_bound:
            return f"whose '{path}' is an int beyond 64 bits"
        items = value.items() if type(value) is dict else enumerate(value) if type(value) in (list, tuple) else ()
        for key, item in items:
            if depth + 1 >= most_deep and type(item) in (dict, list, tuple):
                return f"whose '{path}' is nested more than {most_deep} deep"
            found = walk(item, f"{path}[{_cut(key)}]" if path else _cut(key), depth + 1)
            if found:
                return found
        return ""
    return f"a {_cut(kind)!r} event {walk(data, '', 1) or 'beyond the bounds of its data'}"


def _fields_problem(table: Fields, data: dict, path: str) -> str:
    for key in table.required:
        if key not in data:
            return f"without its '{path}{key}'"
    types = table.types
    for key, value in data.items():
        spec = types.get(key)
        if spec is None:  # a field no one reads: kept as it came, so only what JSON can hold
            if type(key) is not str or not _str_keys(value):
                where = f"'{path}{key}'" if type(key) is str else f"'{path[:-1]}'" if path else "data"
                return f"whose {where} has a key that is not a str"
        elif not _fits(spec, value):
            return _why(spec, value, f"{path}{key}")
    return ""


def _str_keys(value) -> bool:
    """No dict key anywhere in ``value`` that is not a str (nesting is bounded by the decoder)."""
    kind = type(value)
    if kind is dict:
        return all(type(key) is str for key in value) and all(_str_keys(each) for each in value.values())
    if kind is list or kind is tuple:
        return all(_str_keys(each) for each in value)
    return True


def _fits(spec, value) -> bool:
    test = _TESTS.get(id(spec))
    if test is None:
        test = _TESTS[id(spec)] = _test_of(spec)
        _KEPT.append(spec)  # (its id stays its own)
    return test(value)


_TESTS: dict = {}
_KEPT: list = []


def _finite(value) -> bool:
    kind = type(value)
    return kind is int or kind is float and value - value == 0


def _test_of(spec):
    """A predicate for ``spec``, made once: a field's check is one call (a progress event a step is cheap)."""
    kind = type(spec)
    if kind is type:
        return lambda value: type(value) is spec
    if spec is NUMBER:
        return _finite
    if spec is None:
        return lambda value: value is None
    if kind is tuple:
        plain = frozenset(type(None) if each is None else each for each in spec if each is None or type(each) is type)
        others = [_test_of(each) for each in spec if not (each is None or type(each) is type)]
        return lambda value: type(value) in plain or any(test(value) for test in others)
    if kind is ListOf:
        item, most = _test_of(spec.item), spec.most
        return lambda value: type(value) in (list, tuple) and len(value) <= most and all(map(item, value))
    if kind is MapOf:
        item, most = _test_of(spec.value), spec.most
        return lambda value: type(value) is dict and len(value) <= most and all(
            type(key) is str for key in value) and all(map(item, value.values()))
    if kind is OneOf:
        return lambda value: type(value) is str and value in spec.values
    return lambda value: type(value) is dict and not _fields_problem(spec, value, "")


def _why(spec, value, path: str) -> str:
    """What is wrong with ``value`` at ``path`` (it does not fit ``spec``), in words."""
    kind = type(spec)
    if kind is ListOf and type(value) in (list, tuple):
        if len(value) > spec.most:
            return f"whose '{path}' has {len(value)} items, more than {spec.most}"
        index, item = next((index, item) for index, item in enumerate(value) if not _fits(spec.item, item))
        return _why(spec.item, item, f"{path}[{index}]")
    if kind is MapOf and type(value) is dict:
        if len(value) > spec.most:
            return f"whose '{path}' has {len(value)} names, more than {spec.most}"
        key, item = next((key, item) for key, item in value.items()
                         if type(key) is not str or not _fits(spec.value, item))
        if type(key) is not str:
            return f"whose '{path}' has a name that is a {type(key).__name__}, not a str"
        return _why(spec.value, item, f"{path}[{_cut(key)}]")
    if kind is Fields and type(value) is dict:
        return _fields_problem(spec, value, f"{path}.")
    if kind is tuple:  # the one alternative of the value's own shape, if there is one, says more
        shaped = [each for each in spec if type(value) in _containers(each)]
        if len(shaped) == 1:
            return _why(shaped[0], value, path)
    return f"whose '{path}' is {_shown(value)}, not {_spec_text(spec)}"


def _containers(spec) -> tuple:
    kind = type(spec)
    return (list, tuple) if kind is ListOf else (dict,) if kind in (MapOf, Fields) else ()


def _shown(value) -> str:
    kind = type(value).__name__
    named = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    if value is None or type(value) in (str, int, float, bool):
        return f"{_cut(repr(value))} ({named})"
    return named


def _cut(value) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _spec_text(spec) -> str:
    kind = type(spec)
    if kind is type:
        return {str: "a str", int: "an int", bool: "a bool", float: "a float"}.get(spec, spec.__name__)
    if spec is NUMBER:
        return "a finite number"
    if spec is None:
        return "None"
    if kind is tuple:
        return " or ".join(_spec_text(each) for each in spec)
    if kind is ListOf:
        return f"a list of at most {spec.most} items, each {_spec_text(spec.item)}"
    if kind is MapOf:
        return f"a dict of at most {spec.most} names (str), each to {_spec_text(spec.value)}"
    if kind is OneOf:
        return "one of " + ", ".join(repr(each) for each in spec.values)
    return "a dict of " + ", ".join(repr(key) for key in spec.types)
